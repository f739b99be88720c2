"""xgrammar_compat records the xgrammar version its workarounds were measured against: the
installed one must be that version's major.minor (a patch release only warns)."""

from __future__ import annotations

import warnings

from radixflow.runtime.constrained import xgrammar_compat


def test_the_measured_xgrammar_is_the_installed_one():
    installed = xgrammar_compat.installed_version()
    measured = xgrammar_compat.XGRAMMAR_VERSION
    assert installed is not None, "xgrammar is not installed"
    assert xgrammar_compat.unmeasured_version() is None, (
        f"xgrammar {installed} is installed, but runtime/constrained/xgrammar_compat was "
        f"measured against {measured}: re-measure as its docstring says, then set "
        "XGRAMMAR_VERSION")
    if installed != measured:
        warnings.warn(f"xgrammar {installed} is installed; xgrammar_compat was measured "
                      f"against {measured} (a patch release: re-measure when convenient)",
                      stacklevel=1)


def test_a_minor_upgrade_counts_as_unmeasured(monkeypatch):
    major, minor, *_ = xgrammar_compat.XGRAMMAR_VERSION.split(".")
    monkeypatch.setattr(xgrammar_compat, "installed_version", lambda: f"{major}.{minor}.99")
    assert xgrammar_compat.unmeasured_version() is None
    newer = f"{major}.{int(minor) + 1}.0"
    monkeypatch.setattr(xgrammar_compat, "installed_version", lambda: newer)
    assert xgrammar_compat.unmeasured_version() == newer
