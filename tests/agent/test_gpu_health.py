"""The agent's GPU health watch over the fake NVML: every fault kind the issue names, and none on a healthy node.

The fake (nodeagent/fake_nvml.py) provides the pynvml functions the watch
calls, with pynvml's own constants and exceptions, driven by a scenario file
the test rewrites -- corral's own code is not mocked.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nodeagent.fake_gpus import fake_gpu_uuid
from nodeagent.fake_nvml import FakeNvml
from nodeagent.gpu_health import GpuHealthWatch, HealthPolicy, parse_xids
from tests.agent.fixture_paths import FIXTURES
from tests.nvml_scenario import Scenario


@pytest.fixture
def scenario(tmp_path: Path) -> Scenario:
    return Scenario(tmp_path / "nvml.json")


def watch_of(scenario: Scenario, gpus: int = 8, nvlinks: int = 0, policy: HealthPolicy | None = None) -> GpuHealthWatch:
    nvml = FakeNvml(gpus, node_id="n0", scenario=scenario.path, nvlinks=nvlinks)
    w = GpuHealthWatch(nvml, [fake_gpu_uuid("n0", i) for i in range(gpus)], policy, nvlinks=nvlinks or None)
    w.start()
    return w


def test_a_healthy_node_has_no_findings_over_many_polls(scenario: Scenario) -> None:
    w = watch_of(scenario, nvlinks=4)
    assert all(w.poll(0) == [] for _ in range(50))
    assert not w.unsupported


def test_fatal_xids_are_reported_once_application_xids_never(scenario: Scenario) -> None:
    w = watch_of(scenario)
    for xid in (13, 31, 43, 45, 68, 109):
        scenario.xid(1, xid)
    assert w.poll(0) == []
    scenario.xid(3, 79)
    scenario.xid(3, 79)
    scenario.xid(5, 48)
    found = w.poll(0)
    assert [(f.index, f.xid, f.severity) for f in found] == [(3, 79, "fatal"), (5, 48, "fatal")]
    assert found[0].reason == "Xid 79 (GPU has fallen off the bus)" and found[0].uuid == fake_gpu_uuid("n0", 3)
    scenario.xid(2, 999)
    (warn,) = w.poll(0)
    assert (warn.index, warn.severity) == (2, "warning")


def test_the_xid_lists_are_configurable(scenario: Scenario) -> None:
    w = watch_of(scenario, policy=HealthPolicy(fatal_xids=parse_xids("13"), ignored_xids=parse_xids("79")))
    scenario.xid(0, 79)
    scenario.xid(1, 13)
    assert [(f.index, f.severity) for f in w.poll(0)] == [(1, "fatal")]
    with pytest.raises(ValueError, match="not an Xid"):
        parse_xids("48,x")


def test_a_lost_gpu_is_fatal_and_answering_again_is_healthy(scenario: Scenario) -> None:
    w = watch_of(scenario)
    scenario.gpu(6, lost=True)
    (f,) = w.poll(0)
    assert (f.index, f.counter, f.severity, f.healthy) == (6, "gpu_lost", "fatal", False)
    assert w.poll(0) == []
    scenario.gpu(6, lost=False)
    (back,) = w.poll(0)
    assert back.index == 6 and back.healthy


def test_a_gpu_that_disappears_is_fatal(scenario: Scenario) -> None:
    w = watch_of(scenario)
    scenario.gpu(7, gone=True)
    (f,) = w.poll(0)
    assert f.index == 7 and "disappeared" in f.reason


def test_rising_uncorrectable_ecc_is_fatal_but_old_errors_are_not_news(scenario: Scenario) -> None:
    scenario.gpu(2, ecc_uncorrected=3)  # before the agent started
    w = watch_of(scenario)
    assert w.poll(0) == []
    scenario.gpu(2, ecc_uncorrected=5)
    (f,) = w.poll(0)
    assert (f.index, f.counter, f.value) == (2, "ecc_uncorrected_volatile", 5) and "3 -> 5" in f.reason
    scenario.gpu(2, ecc_uncorrected=9)
    assert w.poll(0) == []  # reported once until undrained
    w.clear(2)
    assert w.poll(0) == []  # re-read from here
    scenario.gpu(2, ecc_uncorrected=10)
    assert len(w.poll(0)) == 1


def test_row_remapping_and_retired_pages(scenario: Scenario) -> None:
    w = watch_of(scenario)
    scenario.gpu(0, remap_pending=True)
    scenario.gpu(1, remap_failure=True)
    scenario.gpu(4, retired_pending=True)
    assert sorted((f.index, f.counter) for f in w.poll(0)) == [(0, "remap_pending"), (1, "remap_failure"),
                                                               (4, "retired_pages_pending")]
    scenario.gpu(0, remap_pending=False)
    (done,) = w.poll(0)
    assert done.index == 0 and done.healthy


def test_nvlink_errors_rising_and_throttling_as_a_warning(scenario: Scenario) -> None:
    w = watch_of(scenario, nvlinks=2)
    scenario.gpu(3, nvlink={"1": {"replay": 2}})
    scenario.gpu(5, nvlink={"0": {"crc_flit": 7}})
    scenario.gpu(6, throttle=0x40)
    found = {f.index: f for f in w.poll(0)}
    assert (found[3].severity, found[3].counter) == ("fatal", "nvlink_dl_replay")
    assert (found[5].severity, found[5].counter) == ("warning", "nvlink_dl_crc_flit")
    assert (found[6].severity, found[6].reason) == ("warning", "throttled: hardware thermal slowdown")
    assert w.poll(0) == []  # a warning once per onset


def test_the_h200_fixtures_unsupported_queries_are_skipped_not_faults(scenario: Scenario) -> None:
    """shared/fixtures/nvml/nvml_h200.json: the H200 answers NotSupported to Xid events (a VM's passthrough GPU)."""
    device = json.loads((FIXTURES / "nvml" / "nvml_h200.json").read_text())["devices"][0]
    assert device["xid_supported"]["error"] == "NVMLError_NotSupported"
    scenario.data["unsupported"] = ["xid_events"]
    scenario.write()
    w = watch_of(scenario, gpus=1)
    assert all(link["state"]["error"] == "NVMLError_NotSupported" for link in device["nvlink"])
    assert w.unsupported == {"gpu0.xid_events: NVMLError_NotSupported", "gpu0.nvlink"}
    assert all(w.poll(0) == [] for _ in range(10))
