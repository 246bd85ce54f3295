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


def test_torch_capability_setting_caps_the_instruction_sets_read(monkeypatch):
    from draftnas.core.machine import cpu_has_native_bf16, cpu_identity

    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    full = set(cpu_identity().isa or ())
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    capped = cpu_identity()
    assert set(capped.isa or ()) == full & {"avx2"} and not cpu_has_native_bf16(capped)
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    assert cpu_identity().isa == ()
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx512")  # not a cap below this CPU's: read as it is
    assert set(cpu_identity().isa or ()) == full
