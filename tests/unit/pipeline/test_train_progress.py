"""The train stage's progress lines (pipeline/stages/train/progress.py) from speculators' log as it really looks:
rich's wrapped records (a long path broken mid-word), tqdm's end-of-epoch bar, warnings. Each line says epoch n/N,
the step, the loss and — once an epoch has ended — the steps in all and the ETA; no raw fragment of the log."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from draftscope.core.progress import Watch
from draftscope.pipeline.stages.train import STAGE
from draftscope.pipeline.stages.train.progress import TrainProgress

# The shapes speculators 0.9.0 writes through its rich handler (wrapped at 80 columns), copied from a tiny demo's
# train.log with the paths shortened.
HEADER = """\
[14:10:44] INFO     speculator_type='dflash', dry_run=0, seed=0,   logger.py:736
                    trainer/max_steps=None, logging/logger='',
           INFO     No previous training checkpoint found in      trainer.py:307
                    'runs/demo/pipeline/checkpoints'.
                    Starting fresh training run.
"""
STARTED = "           INFO     Training epoch {e}/{n} started                   trainer.py:737\n"
STEP = """\
[14:10:45] INFO     train/loss={loss}, train/full_acc=0.00e+00,   trainer.py:587
                    train/position_1_acc=0.00e+00,
                    profile/h2d_ms=0.125, profile/clip_ms=16.423,
                    epoch={epoch0}, lr/Muon=0.00e+00, lr/AdamW=0.00e+00,
                    global_step={step}
"""
ENDED = """\
Epoch {epoch0} 100% ━━━━━━━━━━━━━━━━━━━━━━━━━━━━━ {per}/{per}  [ 0:00:19 < 0:00:00 , 3 it/s ]
           INFO     Training epoch {e}/{n} completed                 trainer.py:739
           INFO     Saving checkpoint to                          trainer.py:689
                    runs/demo/p
                    ipeline/checkpoints/{epoch0}
           INFO     Validation epoch {e}/{n} started                 trainer.py:754
[14:11:05] INFO     val/loss_epoch={val},                         trainer.py:671
                    val/eal_epoch=1.000, epoch={epoch0}
           INFO     Validation epoch {e}/{n} completed               trainer.py:756
"""


def rich(text: str) -> str:
    """Each line padded to the handler's 80 columns, as rich writes it."""
    return "".join(line.ljust(80) + "\n" for line in text.splitlines())


RAW = re.compile(r"INFO|trainer\.py|ipeline|checkpoints/|global_step|profile/|━")


def training(epochs: int, per: int):
    """The log's chunks as they land: the header, then each step's record, each epoch's end."""
    yield rich(HEADER)
    step = 0
    for e in range(1, epochs + 1):
        yield rich(STARTED.format(e=e, n=epochs))
        for _ in range(per):
            yield rich(STEP.format(loss=f"{10 / (step + 1):.3f}", epoch0=e - 1, step=step))
            step += 1
        yield rich(ENDED.format(e=e, n=epochs, epoch0=e - 1, per=per, val=f"{5 / e:.3f}"))


def test_train_lines_say_epoch_step_loss_and_eta_never_a_raw_fragment(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    clock = [100.0]
    probe = STAGE.progress(log)  # the stage names its probe; the runner's StageProbe calls it
    assert isinstance(probe, TrainProgress)
    probe.clock = lambda: clock[0]
    said: list[str] = []
    watch = Watch("train", probe, say=said.append, unit=probe.unit, tty=False, clock=lambda: clock[0])
    watch._started = clock[0]
    for chunk in training(epochs=3, per=4):
        with log.open("a", encoding="utf-8") as fh:
            fh.write(chunk)
        clock[0] += 2.0  # one step each 2 s
        watch._poll()
    watch._poll(final=True)
    assert said, "no progress line"
    for line in said:
        assert not RAW.search(line), f"a raw log fragment in a progress line: {line!r}"
    first_step = next(line for line in said if "steps" in line)
    assert "1 steps" in first_step and "epoch 1/3" in first_step and "loss 10.000" in first_step
    assert "ETA once epoch 1 ends" in first_step
    # After the first epoch: 4 steps an epoch × 3 epochs, the rate since the first step, the time left.
    later = [line for line in said if "/12 steps" in line]
    assert later, said
    line5 = next(line for line in later if "5/12 steps" in line)
    assert re.search(r"epoch 2/3, loss 2\.000, val loss 5\.000 \(epoch 1\)", line5), line5
    assert re.search(r"0\.\d steps/s", line5) and re.search(r"ETA \d+ s", line5), line5
    assert "12/12 steps" in said[-1] and "ETA" not in said[-1]
    assert probe.note() == "epoch 3/3, finished, loss 0.833, val loss 1.667 (epoch 3)"


def test_the_eta_counts_down_from_the_rate_after_loading(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    clock = [0.0]
    probe = TrainProgress(log, clock=lambda: clock[0])
    chunks = list(training(epochs=2, per=5))
    log.write_text(chunks[0] + chunks[1])
    clock[0] = 60.0  # a minute of loading: not part of the rate
    assert probe().done is None and probe().note == "epoch 1/2"
    readings = []
    for chunk in chunks[2:]:
        with log.open("a", encoding="utf-8") as fh:
            fh.write(chunk)
        clock[0] += 1.0
        readings.append(probe())
    # Step 1 seen at 61 s, step 6 at 68 s (the epoch's end and the next start took a poll each): 5 steps in 7 s.
    after_epoch = next(r for r in readings if r.total == 10 and r.done == 6)
    assert after_epoch.rate == "0.7 steps/s" and after_epoch.eta == pytest.approx(4 / (5 / 7))


def test_a_previous_runs_log_is_not_this_runs_progress(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text("".join(training(epochs=2, per=3)))  # a finished run; the runtime appends the next to it
    probe = TrainProgress(log)
    reading = probe()
    assert reading.done is None and reading.note == "loading the model and data"
    with log.open("a", encoding="utf-8") as fh:
        fh.write(STARTED.format(e=1, n=2) + STEP.format(loss="3.000", epoch0=0, step=0))
    assert probe().done == 1
    with log.open("a", encoding="utf-8") as fh:
        ended = ENDED.format(e=1, n=2, epoch0=0, per=1, val="4.000")
        fh.write(rich(ended[: ended.index("Validation epoch 1/2 completed")]))  # validation under way
    assert probe().note == "epoch 1/2, validating, loss 3.000, val loss 4.000 (epoch 1)"


def test_max_steps_below_the_epochs_bound_the_total(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    probe = TrainProgress(log)
    text = "".join(training(epochs=3, per=4)).replace("trainer/max_steps=None", "trainer/max_steps=7")
    log.write_text(text)
    assert probe().total == 7
