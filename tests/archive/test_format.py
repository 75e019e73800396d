"""The archive's format and its guards (events/archive.py), the purge rule (orchestrator/archiver.py), sizes.

Files on a real temp dir; the purge rule is a pure function of manifests and stream facts.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from events.archive import FORMAT, Archive, ArchiveError, Manifest, Record, SegmentRefused
from orchestrator.archiver import StreamFacts, purge_point
from orchestrator.cli.archive import parse_size
from orchestrator.cli.errors import CliError
from tests.archive.segcheck import read_archive


def recs(first: int, last: int, t0: int = 1_000) -> list[Record]:
    return [Record(s, f"corral.node.n{s}.NodeCordoned", t0 + s, b'{"type":"NodeCordoned","n":%d}' % s)
            for s in range(first, last + 1)]


def test_segments_round_trip_and_are_read_by_an_independent_checker(tmp_path: Path) -> None:
    a = Archive(tmp_path)
    a.append(recs(1, 10))
    a.append(recs(11, 25))
    assert a.last_seq() == 25
    assert list(a.records(5, 12)) == recs(5, 12)
    assert [(r.seq, r.subject, r.time_ns, r.data) for r in a.records()] == read_archive(tmp_path)
    m = a.segments()[1]
    assert (m.first_seq, m.last_seq, m.count, m.format, m.first_time_ns) == (11, 25, 15, FORMAT, 1011)


def test_a_writer_refuses_duplicates_and_disorder(tmp_path: Path) -> None:
    a = Archive(tmp_path)
    a.append(recs(1, 10))
    with pytest.raises(ArchiveError, match="not in order after the archive's last position 10"):
        a.append(recs(10, 12))
    with pytest.raises(ArchiveError):
        a.append([*recs(11, 12), *recs(11, 11)])
    assert a.last_seq() == 10


def test_a_flipped_byte_is_named_and_refused(tmp_path: Path) -> None:
    a = Archive(tmp_path)
    a.append(recs(1, 10))
    m = a.append(recs(11, 20))
    seg = tmp_path / m.segment
    blob = bytearray(seg.read_bytes())
    blob[len(blob) // 2] ^= 0x01
    seg.write_bytes(bytes(blob))
    with pytest.raises(SegmentRefused, match=f"segment {seg}: checksum mismatch") as e:
        list(a.records(1))
    assert (e.value.first_seq, e.value.last_seq) == (11, 20)
    assert [r.seq for r in a.records(1, 10)] == list(range(1, 11)), "the sound segment still reads"


def test_a_newer_format_is_refused_with_a_clear_message(tmp_path: Path) -> None:
    a = Archive(tmp_path)
    m = a.append(recs(1, 3))
    manifest = tmp_path / m.segment.replace(".seg", ".json")
    data = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**data, "format": FORMAT + 1, "writer": "corral 9.0"}))
    with pytest.raises(SegmentRefused, match=r"written by a newer corral \(corral 9\.0, segment format 2"):
        a.segments()
    manifest.write_text(json.dumps(data))
    seg = tmp_path / m.segment
    blob = bytearray(seg.read_bytes())
    blob[7] = FORMAT + 1  # the header's format
    seg.write_bytes(bytes(blob))
    manifest.write_text(json.dumps({**data, "sha256": __import__("hashlib").sha256(blob).hexdigest()}))
    with pytest.raises(SegmentRefused, match="written by a newer corral \\(segment format 2"):
        list(a.records())


def test_a_crash_leaves_a_whole_segment_or_none(tmp_path: Path) -> None:
    """What each crash point leaves: a temp file, or a .seg whose manifest never came; neither counts, and
    the next writer removes them and writes the positions again."""
    a = Archive(tmp_path)
    a.append(recs(1, 5))
    (tmp_path / "000000000006-000000000009.seg.tmp").write_bytes(b"half")
    (tmp_path / "000000000006-000000000010.seg").write_bytes(b"whole, but no manifest")
    (tmp_path / "000000000006-000000000010.json.tmp").write_bytes(b"{")
    assert a.last_seq() == 5
    assert [r[0] for r in read_archive(tmp_path)] == [1, 2, 3, 4, 5]
    assert len(a.clean()) == 3
    a.append(recs(6, 8))
    assert [r.seq for r in a.records()] == list(range(1, 9))


def test_a_failed_write_leaves_no_segment(tmp_path: Path) -> None:
    a = Archive(tmp_path)
    a.append(recs(1, 5))
    (tmp_path / "000000000006-000000000008.json").mkdir()  # the manifest's rename fails
    with pytest.raises(OSError):
        a.append(recs(6, 8))
    assert not (tmp_path / "000000000006-000000000008.seg").exists()


def manifest(first: int, last: int, t_first: int, t_last: int) -> Manifest:
    return Manifest(format=1, writer="t", segment=f"{first:012d}-{last:012d}.seg", first_seq=first, last_seq=last,
                    first_time_ns=t_first, last_time_ns=t_last, count=last - first + 1, bytes=1, sha256="")


S = 1_000_000_000
SEGS = [manifest(1, 100, 0, 10 * S), manifest(101, 200, 11 * S, 20 * S), manifest(201, 300, 21 * S, 30 * S)]


def facts(first: int = 1, last: int = 350, newest_s: int = 35) -> StreamFacts:
    return StreamFacts(first=first, last=last, messages=last - first + 1, bytes=(last - first + 1) * 100,
                       newest_time_ns=newest_s * S)


def test_age_cuts_whole_archived_segments_on_the_streams_clock() -> None:
    # Newest event at 35 s, keep 20 s: segments ending before 15 s go (the first), not the second (ends at 20 s).
    assert purge_point(SEGS, facts(), retention_s=20, max_bytes=None, snapshot_seq=10_000) == 101
    # Everything is old: only what the archive holds goes; 301..350 are not archived and stay.
    assert purge_point(SEGS, facts(newest_s=10_000), retention_s=1, max_bytes=None, snapshot_seq=10_000) == 301


def test_size_cuts_oldest_segments_until_under_the_limit() -> None:
    # 350 messages x 100 B = 35,000 B; under 20,000 B needs 150 dropped: two segments.
    assert purge_point(SEGS, facts(), retention_s=None, max_bytes=20_000, snapshot_seq=10_000) == 201
    # Already purged up to 101: 250 x 100 B; under 20,000 needs 50: the second segment.
    assert purge_point(SEGS, facts(first=101), retention_s=None, max_bytes=20_000, snapshot_seq=10_000) == 201
    assert purge_point(SEGS, facts(), retention_s=None, max_bytes=1_000_000, snapshot_seq=10_000) == 1


def test_the_cut_never_passes_the_archive_or_the_newest_snapshot() -> None:
    assert purge_point(SEGS, facts(), retention_s=None, max_bytes=1, snapshot_seq=10_000) == 301
    assert purge_point(SEGS, facts(), retention_s=None, max_bytes=1, snapshot_seq=150) == 151
    assert purge_point(SEGS, facts(), retention_s=None, max_bytes=1, snapshot_seq=0) == 1, "no snapshot: keep all"
    assert purge_point([], facts(), retention_s=0, max_bytes=1, snapshot_seq=10_000) == 1, "no archive: keep all"


def test_sizes() -> None:
    assert parse_size("20GB") == 20 * 10**9
    assert parse_size("500mb") == 500 * 10**6
    assert parse_size("1.5GiB") == int(1.5 * 2**30)
    assert parse_size("4096") == 4096
    with pytest.raises(CliError, match="bad size"):
        parse_size("lots")
