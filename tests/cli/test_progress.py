"""Progress in a log: a line per stage, a heartbeat at least every interval, elapsed and ETA."""

from __future__ import annotations

import io
import logging

from draftnas.cli.progress import LogProgress, _Forward, clock_text


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def lines(stream: io.StringIO) -> list[str]:
    return stream.getvalue().splitlines()


def test_a_stage_prints_its_start_its_progress_with_an_eta_and_its_end():
    clock, out = FakeClock(), io.StringIO()
    p = LogProgress(out, clock=clock, interval_s=30)
    step = p.on("trials")
    step(0, 16)
    assert lines(out) == ["[draftnas 0s] trials: started (16 steps)"]
    clock.now += 10
    step(4, 16)
    p.tick()  # not due: 10 s since the last line
    assert len(lines(out)) == 1
    clock.now += 20
    p.tick()  # 30 s: 4 of 16 done in 30 s, 12 left at that rate
    assert lines(out)[-1] == "[draftnas 30s] trials: 4/16, 30s in this stage, eta 1m30s"
    clock.now += 5
    step(16, 16)
    assert lines(out)[-1] == "[draftnas 35s] trials: done, 35s"


def test_between_stages_the_heartbeat_says_what_the_library_last_logged():
    clock, out = FakeClock(), io.StringIO()
    p = LogProgress(out, clock=clock, interval_s=30)
    forward = _Forward(lambda kind, message: setattr(p, "said", message))  # what the child is sent
    logging.getLogger("draftnas").addHandler(forward)
    try:
        logging.getLogger("draftnas.search").warning("building traces of qwen")
    finally:
        logging.getLogger("draftnas").removeHandler(forward)
    clock.now += 31
    p.tick()
    assert lines(out) == ["[draftnas 31s] working: building traces of qwen"]
    clock.now += 29
    p.tick()
    assert len(lines(out)) == 1  # one line per interval, no more


def test_a_stage_heartbeat_names_what_the_library_said_during_that_stage_only():
    """A stage whose first step waits on minutes of model builds says which build it is at."""
    clock, out = FakeClock(), io.StringIO()
    p = LogProgress(out, clock=clock, interval_s=30)
    p.said = "int8 product 4864x896: fp32 activations 3.78 ms"  # said before the stage: not its news
    clock.now += 5
    step = p.on("timing the target on this machine")
    step(0, 384)
    clock.now += 31
    p.tick()
    assert lines(out)[-1] == "[draftnas 36s] timing the target on this machine: 0/384, 31s in this stage"
    p.said = "building qwen2.5-coder-0.5b with int4 weights (random weights) and choosing its kernels"
    clock.now += 30
    p.tick()
    assert lines(out)[-1] == ("[draftnas 1m06s] timing the target on this machine: 0/384, 1m01s in this "
                              "stage; building qwen2.5-coder-0.5b with int4 weights (random weights) and "
                              "choosing its kernels")


def test_the_heartbeat_child_prints_stages_and_beats_on_its_own(capfd):
    """The lines come from a child process: it beats while the command sends nothing."""
    import time

    from draftnas.cli.progress import ChildProgress

    child = ChildProgress(interval_s=0.3)
    child.start()
    child.on("trials")(0, 4)
    child.on("trials")(1, 4)
    time.sleep(1.5)  # no event for 5 intervals: the child says where the stage stands
    child.on("trials")(4, 4)
    child.stop()
    err = capfd.readouterr().err.splitlines()
    body = [line.split("] ", 1)[1] for line in err if line.startswith("[draftnas")]
    assert body[0] == "trials: started (4 steps)" and body[-2].startswith("trials: done")
    beats = [line for line in body if line.startswith("trials: 1/4")]
    assert len(beats) >= 2 and "eta" in beats[0], body
    assert body[-1].startswith("finished in")


def test_clock_text():
    assert [clock_text(s) for s in (3, 123, 3723)] == ["3s", "2m03s", "1h02m03s"]
