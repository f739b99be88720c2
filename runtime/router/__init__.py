"""`radixflow router`: one HTTP endpoint in front of several `radixflow serve` workers, routed
with the balancing policy of runtime/balance/ (which `radixflow serve --dp-size N` uses too).

args.py (RouterArgs, its flags), router.py (the workers, their health, the policy's pick),
proxy.py (relaying, with retries before the first byte), routing_key.py, auth.py (the
server's key middleware plus the admin key), errors.py, metrics.py, app.py (the routes and
run_router)."""
