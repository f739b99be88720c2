from __future__ import annotations

import subprocess
import sys


def test_import_radixflow_does_not_import_torch():
    code = ("import sys, radixflow as rf; rf.Engine; rf.Runtime; "
            "assert rf.__all__ and all(hasattr(rf, n) for n in rf.__all__); "
            "print(sorted(m for m in ('torch', 'transformers', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
