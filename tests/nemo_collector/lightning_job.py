"""A tiny Mixtral (Hugging Face, random weights, 4 experts, top-2) trained by Lightning on CPU
ranks with ChakraTraceCallback, run as its own script: Lightning's ``ddp`` launcher re-runs
``sys.argv``.

    python lightning_job.py OUT STRATEGY [--nemo] [--fail-at STEP] [--devices N]

``--nemo``: NeMo 2's ``nl.Trainer`` with the callback built from ``nemo_run``'s ``run.Config``
(NeMo deep-copies every argument in ``io_init``).
"""

from __future__ import annotations

import argparse
import os

import lightning.pytorch as pl
import torch
from transformers import MixtralConfig, MixtralForCausalLM

VOCAB, SEQ, MICRO_BATCH = 128, 16, 2
LAYERS, EXPERTS, TOP_K = 2, 4, 2
MAX_STEPS, ACCUMULATE, START, NUM = 5, 2, 2, 2


class TinyMixtral(pl.LightningModule):
    """At module level: ``ddp_spawn`` pickles the module into its processes."""

    def __init__(self, fail_at: int | None = None) -> None:
        super().__init__()
        torch.manual_seed(0)
        config = MixtralConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                               num_hidden_layers=LAYERS, num_attention_heads=4,
                               num_key_value_heads=2, num_local_experts=EXPERTS,
                               num_experts_per_tok=TOP_K, max_position_embeddings=64)
        self.model = MixtralForCausalLM(config)
        self.fail_at = fail_at

    def training_step(self, batch, batch_idx):
        if self.fail_at is not None and self.trainer.global_step == self.fail_at:
            raise ValueError(f"planned failure at step {self.fail_at}")
        return self.model(input_ids=batch, labels=batch).loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def loader():
    data = torch.randint(0, VOCAB, (64, SEQ), generator=torch.Generator().manual_seed(0))
    return torch.utils.data.DataLoader(data, batch_size=MICRO_BATCH)


def trainer_kwargs(strategy: str, devices: int) -> dict:
    return dict(accelerator="cpu", devices=devices, strategy=strategy, max_steps=MAX_STEPS,
                accumulate_grad_batches=ACCUMULATE, logger=False, enable_checkpointing=False,
                enable_progress_bar=False, enable_model_summary=False)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("strategy")
    ap.add_argument("--nemo", action="store_true")
    ap.add_argument("--fail-at", type=int)
    ap.add_argument("--devices", type=int, default=2)
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.nemo:
        import fiddle as fdl
        import nemo_run as run
        from nemo import lightning as nl
        from chakra_hooks.collectors.nemo import ChakraTraceCallback

        config = run.Config(ChakraTraceCallback, output_dir=args.out, start_step=START,
                            num_steps=NUM)
        callback = fdl.build(config)  # what nemo_run does with a recipe's trainer.callbacks
        trainer = nl.Trainer(callbacks=[callback], **trainer_kwargs(args.strategy, args.devices))
    else:
        from chakra_hooks.collectors.nemo import ChakraTraceCallback

        callback = ChakraTraceCallback(args.out, start_step=START, num_steps=NUM)
        trainer = pl.Trainer(callbacks=[callback], **trainer_kwargs(args.strategy, args.devices))
    trainer.fit(TinyMixtral(args.fail_at), loader())


if __name__ == "__main__":
    main()
