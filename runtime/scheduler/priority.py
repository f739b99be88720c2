"""Priority scheduling (--enable-priority-scheduling), as SGLang does it: waiting requests are
admitted lower `priority` value first (admission.order_waiting), and one that finds no room (no
running place, no request row, too few KV slots: admission.Blocked) makes some by retracting
running requests of a strictly higher value, the highest value first and, within one value, the
latest arrival first. A retracted request goes back to waiting through decode.retract: its KV
goes to the radix tree and it resumes later with its output kept.

Nothing is retracted unless the victims' room covers what the blocked request lacks, and never
for a request of the same or a higher value: equal priorities keep first-come behaviour, and a
retracted request can never retract the one it made room for, so nothing ping-pongs.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from .decode import retract

if TYPE_CHECKING:
    from .admission import Blocked
    from .req import Req
    from .state import SchedulerState

logger = logging.getLogger(__name__)


class Preemption:
    def __init__(self, state: SchedulerState):
        self.state = state
        self.num_retractions = 0  # running requests retracted to admit a lower value

    def make_room(self, blocked: Blocked | None) -> bool:
        """Retract running requests of a higher value than `blocked.req` until it would fit
        (none if all of them would not do); whether any was retracted."""
        if blocked is None:
            return False
        want = blocked.req.priority
        victims = sorted((r for r in self.state.running if r.priority > want),
                         key=lambda r: (-r.priority, -r.arrival))
        chosen: list[Req] = []
        released: dict[int, int] = {}  # id(node) -> locks the chosen victims hold on it
        room = 0
        for victim in victims:
            if (chosen or not blocked.place) and room >= blocked.kv_slots:
                break
            chosen.append(victim)
            room += kv_room(victim, released)
        if not chosen or room < blocked.kv_slots:
            return False
        for victim in chosen:
            logger.info("priority: retracting request %s (priority %d) for %s (priority %d)",
                        victim.rid, victim.priority, blocked.req.rid, want)
            retract(self.state, victim)
            self.num_retractions += 1
        return True


def kv_room(req: Req, released: dict[int, int]) -> int:
    """The KV slots admission gains once `req` is retracted: its decode reservation, the
    slots it holds beyond its tree part (they go to the tree unlocked), and the tokens of its
    locked tree path that no one else holds (`released` counts the locks already given up by
    other victims, and takes this one's)."""
    room = max(1, req.seq_len - req.computed_len) + req.owned_slots
    node = req.last_node
    while node is not None and node.parent is not None:
        released[id(node)] = released.get(id(node), 0) + 1
        if released[id(node)] == node.lock_ref:
            room += len(node.key)
        node = node.parent
    return room
