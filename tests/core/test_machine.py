from __future__ import annotations

from draftnas.core.machine import available_memory_bytes

MEMINFO = """MemTotal:       24000000 kB
MemFree:         6800000 kB
MemAvailable:   22000000 kB
Cached:         15000000 kB
"""


def test_available_memory_counts_the_page_cache_the_kernel_can_drop(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text(MEMINFO)
    assert available_memory_bytes(meminfo) == 22_000_000 * 1024  # not MemFree's 6.8 GB


def test_without_meminfo_free_pages_stand_in_then_four_gib(tmp_path, monkeypatch):
    import draftnas.core.machine as machine

    pages = {"SC_AVPHYS_PAGES": 1000, "SC_PAGE_SIZE": 4096}
    monkeypatch.setattr(machine.os, "sysconf", lambda name: pages[name])
    (tmp_path / "old").write_text("MemTotal: 1 kB\nMemFree: 2 kB\n")  # a kernel without MemAvailable
    assert available_memory_bytes(tmp_path / "old") == 1000 * 4096
    assert available_memory_bytes(tmp_path / "absent") == 1000 * 4096

    def no_sysconf(name):
        raise ValueError(name)

    monkeypatch.setattr(machine.os, "sysconf", no_sysconf)
    assert available_memory_bytes(tmp_path / "absent") == 4 << 30
