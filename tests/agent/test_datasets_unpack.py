"""The tar reader and safe writer (nodeagent/datasets/tarstream.py, safetree.py, #39): hostile archives.

Each archive is built here with Python's tarfile/zipfile (the attacker's tools), unpacked through
fetch.unpack_archive, and the result judged on the disk: a sentinel beside the dataset's directory is
never touched, nothing appears outside it, and the refusal names what was wrong.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import tarfile
import threading
import zipfile
from pathlib import Path

import pytest

from nodeagent.datasets.fetch import Refused, StagingError, unpack_archive
from nodeagent.datasets.limits import Limits
from tests.dataset_source import make_tree, tree_sum

MB = 1 << 20
SENTINEL = b"untouched\n"


def _tar(members: list[tuple[tarfile.TarInfo, bytes | None]], fmt: int = tarfile.PAX_FORMAT) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def _info(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    t = tarfile.TarInfo(name)
    t.type, t.linkname, t.mode = kind, link, 0o644 if kind != tarfile.DIRTYPE else 0o755
    return t


def _unpack(data: bytes, where: Path, limits: Limits | None = None) -> Path:
    """Unpack `data` into where/stage/data beside where/sentinel; the data directory."""
    (where / "sentinel").write_bytes(SENTINEL)
    dest = where / "stage" / "data"
    dest.mkdir(parents=True)
    unpack_archive("test://archive", io.BytesIO(data), len(data), dest, "", lambda d, t: None, threading.Event(),
                   limits)
    return dest


def _outside_untouched(where: Path) -> None:
    assert (where / "sentinel").read_bytes() == SENTINEL
    assert sorted(p.name for p in where.iterdir()) == ["sentinel", "stage"]
    assert sorted(p.name for p in (where / "stage").iterdir()) == ["data"]


@pytest.mark.parametrize("comp", ["", "gz", "bz2", "xz"])
def test_a_tree_unpacks_exactly(tmp_path: Path, comp: str) -> None:
    tree = tmp_path / "tree"
    want = make_tree(tree, 1 * MB)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=f"w:{comp}" if comp else "w") as tar:  # type: ignore[call-overload]
        for p in sorted(tree.rglob("*")):
            tar.add(p, arcname=p.relative_to(tree).as_posix(), recursive=False)
        tar.addfile(_info("links/rel", tarfile.SYMTYPE, "../a" if False else "x"))
        tar.add(tree / "a" / "part-001.bin", arcname="links/hard", recursive=False)
        tar.addfile(_info("links/hard2", tarfile.LNKTYPE, "a/part-001.bin"))
    where = tmp_path / "w"
    where.mkdir()
    dest = _unpack(buf.getvalue(), where)
    assert tree_sum(dest / "a") == tree_sum(tree / "a") and tree_sum(dest / "b") == tree_sum(tree / "b")
    assert want
    assert os.readlink(dest / "links" / "rel") == "x"
    assert (dest / "links" / "hard2").read_bytes() == (tree / "a" / "part-001.bin").read_bytes()
    _outside_untouched(where)


def test_a_symlink_chain_past_the_path_limit_writes_nothing_outside(tmp_path: Path) -> None:
    """The 2025 tarfile realpath bypass (CVE-2025-4517's shape): directories of 247-character names and links
    to them, a link climbing back through the chain, then a file written through it."""
    comp = "d" * 247
    members: list[tuple[tarfile.TarInfo, bytes | None]] = []
    path = ""
    for step in "abcdefghijklmnop":
        members.append((_info(os.path.join(path, comp), tarfile.DIRTYPE), None))
        members.append((_info(os.path.join(path, step), tarfile.SYMTYPE, comp), None))
        path = os.path.join(path, comp)
    linkpath = os.path.join("/".join("abcdefghijklmnop"), "l" * 254)
    members.append((_info(linkpath, tarfile.SYMTYPE, "../" * 16), None))
    members.append((_info("escape", tarfile.SYMTYPE, linkpath + "/../../sentinel"), None))
    members.append((_info("escape", tarfile.REGTYPE), b"overwritten\n"))
    where = tmp_path / "w"
    where.mkdir()
    with pytest.raises(Refused, match="may lead outside"):
        _unpack(_tar(members), where)
    _outside_untouched(where)


def test_a_member_never_goes_through_a_link_the_archive_made(tmp_path: Path) -> None:
    where = tmp_path / "w"
    where.mkdir()
    members: list[tuple[tarfile.TarInfo, bytes | None]] = [
        (_info("sub", tarfile.DIRTYPE), None),
        (_info("l", tarfile.SYMTYPE, "sub"), None),  # a legal link, inside
        (_info("l/evil", tarfile.REGTYPE), b"x"),  # but no member goes through it
    ]
    with pytest.raises(Refused, match="is a link or a file"):
        _unpack(_tar(members), where)
    _outside_untouched(where)
    assert not (where / "stage" / "data" / "sub" / "evil").exists()


@pytest.mark.parametrize("target", ["/etc/passwd", "../sentinel", "a/../../sentinel", "/"])
def test_links_that_may_lead_out_are_refused(tmp_path: Path, target: str) -> None:
    where = tmp_path / "w"
    where.mkdir()
    with pytest.raises(Refused, match="may lead outside"):
        _unpack(_tar([(_info("l", tarfile.SYMTYPE, target), None)]), where)
    _outside_untouched(where)


@pytest.mark.parametrize("target", ["/etc/passwd", "../sentinel", "../../w/sentinel", "nothing/there"])
def test_hard_links_out_or_to_nothing_are_refused(tmp_path: Path, target: str) -> None:
    where = tmp_path / "w"
    where.mkdir()
    with pytest.raises(Refused):
        _unpack(_tar([(_info("h", tarfile.LNKTYPE, target), None)]), where)
    _outside_untouched(where)
    assert os.stat(where / "sentinel").st_nlink == 1


def test_an_absolute_member_and_dotdot_are_refused(tmp_path: Path) -> None:
    where = tmp_path / "w"
    where.mkdir()
    with pytest.raises(Refused, match="is an absolute path"):
        _unpack(_tar([(_info(str(where / "sentinel")), b"x")], fmt=tarfile.GNU_FORMAT), where)
    _outside_untouched(where)
    where2 = tmp_path / "w2"
    where2.mkdir()
    with pytest.raises(Refused, match="climbs out"):
        _unpack(_tar([(_info("a/../../sentinel"), b"x")]), where2)
    _outside_untouched(where2)


@pytest.mark.parametrize("kind", [tarfile.CHRTYPE, tarfile.BLKTYPE, tarfile.FIFOTYPE])
def test_special_files_are_refused(tmp_path: Path, kind: bytes) -> None:
    where = tmp_path / "w"
    where.mkdir()
    info = _info("dev", kind)
    info.devmajor, info.devminor = 1, 3
    with pytest.raises(Refused, match="only files, directories and links"):
        _unpack(_tar([(info, None)]), where)
    _outside_untouched(where)


def _sparse_bomb() -> bytes:
    """About 1 KB: a GNU sparse member (old format) declaring 100 GB of holes."""
    info = _info("bomb")
    hdr = bytearray(info.tobuf(format=tarfile.GNU_FORMAT))
    hdr[156:157] = b"S"
    hdr[124:136] = b"%011o\0" % 0  # no data stored
    hdr[483:495] = (0x80).to_bytes(1, "big") + (100 << 30).to_bytes(11, "big")  # realsize, base-256
    hdr[148:156] = b" " * 8
    hdr[148:156] = b"%06o\0 " % sum(hdr)
    return gzip.compress(bytes(hdr) + b"\0" * 1024)


def test_a_1kb_archive_declaring_100gb_is_refused(tmp_path: Path) -> None:
    data = _sparse_bomb()
    assert len(data) < 1100
    where = tmp_path / "w"
    where.mkdir()
    with pytest.raises(Refused, match="sparse"):
        _unpack(data, where)
    _outside_untouched(where)


@pytest.mark.parametrize("pack", [gzip.compress, bz2.compress, lzma.compress])
def test_a_decompression_bomb_stops_at_the_ratio(tmp_path: Path, pack: object) -> None:
    inner = _tar([(_info("zeros"), b"\0" * (64 * MB))])
    data = pack(inner)  # type: ignore[operator]
    where = tmp_path / "w"
    where.mkdir()
    with pytest.raises(Refused, match="decompression bomb"):
        _unpack(data, where, Limits(ratio_floor=4 * MB, max_ratio=10))
    _outside_untouched(where)
    written = sum(p.stat().st_size for p in (where / "stage").rglob("*") if p.is_file())
    assert written < 8 * MB


def test_total_bytes_and_members_are_limited(tmp_path: Path) -> None:
    where = tmp_path / "w"
    where.mkdir()
    with pytest.raises(Refused, match="--dataset-max-bytes"):
        _unpack(_tar([(_info("big"), b"x" * (2 * MB))]), where, Limits(max_bytes=1 * MB))
    assert not (where / "stage" / "data" / "big").exists()  # refused before a byte was written
    where2 = tmp_path / "w2"
    where2.mkdir()
    with pytest.raises(Refused, match="--dataset-max-members"):
        _unpack(_tar([(_info(f"f{i}"), b"") for i in range(20)]), where2, Limits(max_members=10))


def test_a_huge_header_extension_is_refused_unread(tmp_path: Path) -> None:
    where = tmp_path / "w"
    where.mkdir()
    info = _info("x" * 10)
    info.pax_headers = {"comment": "y" * (2 * MB)}
    with pytest.raises(Refused, match="header extension"):
        _unpack(_tar([(info, b"z")]), where)


@pytest.mark.parametrize("cut", [100, 700, 1500])
def test_truncated_and_garbage_archives_say_so(tmp_path: Path, cut: int) -> None:
    data = gzip.compress(_tar([(_info("f"), os.urandom(4000))]))
    where = tmp_path / f"w{cut}"
    where.mkdir()
    with pytest.raises(StagingError, match=r"truncated|corrupt|not a readable"):
        _unpack(data[:cut], where)
    where2 = tmp_path / f"g{cut}"
    where2.mkdir()
    with pytest.raises(StagingError, match="not a readable"):
        _unpack(os.urandom(cut), where2)


def test_a_hostile_zip_is_refused_like_a_tar(tmp_path: Path) -> None:
    for i, (name, why) in enumerate([("../sentinel", "climbs out"), ("a/../../x", "climbs out")]):
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as z:
            z.writestr(name, b"overwritten\n")
        where = tmp_path / f"w{i}"
        where.mkdir()
        with pytest.raises(Refused, match=why):
            _unpack(buf.getvalue(), where)
        _outside_untouched(where)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        link = zipfile.ZipInfo("l")
        link.external_attr = (0o120777 << 16)
        z.writestr(link, "/etc")
    where = tmp_path / "wl"
    where.mkdir()
    with pytest.raises(Refused, match="may lead outside"):
        _unpack(buf.getvalue(), where)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("zeros", b"\0" * (32 * MB))
    where = tmp_path / "wb"
    where.mkdir()
    with pytest.raises(Refused, match="decompression bomb"):
        _unpack(buf.getvalue(), where, Limits(ratio_floor=2 * MB, max_ratio=10))


def test_the_root_directory_member_of_tar_c_dot_is_the_tree_itself(tmp_path: Path) -> None:
    """`tar -C dir -czf x.tgz .` writes `./` first: the directory itself, nothing to refuse."""
    where = tmp_path / "w"
    where.mkdir()
    dest = _unpack(_tar([(_info("./", tarfile.DIRTYPE), None), (_info("./a/f"), b"hi")]), where)
    assert (dest / "a" / "f").read_bytes() == b"hi"
    _outside_untouched(where)
