"""`corral gpu drain|undrain NODE:IDX`: the address is checked before anything is appended."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest

from orchestrator.cli.admin import gpu_address


def test_gpu_address_parses_node_and_index() -> None:
    assert gpu_address("dgx-07:3") == ("dgx-07", 3)
    for bad in ("dgx-07", "dgx-07:", ":3", "dgx-07:x", "dgx-07:-1"):
        with pytest.raises(argparse.ArgumentTypeError, match="NODE:IDX"):
            gpu_address(bad)


def test_a_bad_address_is_a_usage_error_naming_it() -> None:
    out = subprocess.run([sys.executable, "-m", "orchestrator.cli", "gpu", "drain", "dgx-07"], capture_output=True,
                         text=True, timeout=60, env={**os.environ, "CORRAL_NATS_URL": "nats://127.0.0.1:1"})
    assert out.returncode == 2
    assert "expected NODE:IDX (e.g. dgx-07:3), got 'dgx-07'" in out.stderr
