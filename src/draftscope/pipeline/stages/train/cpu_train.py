"""A kit-owned device shim that lets speculators' trainer run on a CPU, for the tiny preset only.

speculators 0.9.0's trainer assumes an accelerator: it moves the model and each batch to the integer local rank
(an accelerator index), synchronizes through `torch.accelerator`, and picks its autocast device from the current
accelerator ("cuda" when there is none). This module points those three at the CPU, then runs the trainer's own
entry point with the same flags `torchrun -m speculators.train` gets. Nothing else changes: the model, losses,
data loading and checkpoints are speculators' own. The stage record notes that the shim was used.

Used only by the train stage of a CPU plan (`device: cpu`, `--runtime local`); a machine with CUDA is refused.
"""

from __future__ import annotations

import sys

from draftscope.core.errors import MissingDependency, UserError, run_main


def patch() -> None:
    # lazy: torch, in the train image only
    import torch

    if torch.cuda.is_available():
        raise UserError("the CPU shim is for machines without CUDA", fix="train with torchrun (device: cuda)")
    # lazy: speculators, in the train image only
    try:
        from speculators.train import trainer
    except ImportError as exc:
        raise MissingDependency(exc.name or "speculators", image="train") from None

    trainer.get_local_rank = lambda: "cpu"  # model.to(...) / batch.to(...) take a device, not only an index
    torch.accelerator.synchronize = lambda *args, **kwargs: None  # timing marks synchronize; a CPU needs none
    original_init = trainer.Trainer.__init__

    def init(self, *args, **kwargs):  # autocast on the CPU, not on "cuda"
        real = torch.accelerator.current_accelerator
        torch.accelerator.current_accelerator = lambda *a, **k: torch.device("cpu")
        try:
            original_init(self, *args, **kwargs)
        finally:
            torch.accelerator.current_accelerator = real

    trainer.Trainer.__init__ = init


def main(argv: list[str] | None = None) -> int:
    patch()
    # lazy: speculators, in the train image only
    from speculators.train.cli import main as train_main
    from speculators.train.config import TrainConfig

    train_main(TrainConfig.resolve(list(sys.argv[1:] if argv is None else argv)))
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
