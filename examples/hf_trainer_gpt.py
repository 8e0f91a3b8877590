"""Train a tiny GPT-2 from scratch with the Hugging Face ``Trainer`` under torchrun.

The ``Trainer`` keeps its defaults (AdamW, linear decay, ``max_grad_norm=1.0``
clipping between backward and the step, DDP with
``find_unused_parameters=True``, seed 42) except what CPU, a tiny model and a
run of seconds need: ``use_cpu``, the batch, the number of steps, a learning
rate for a model trained from scratch, no checkpoints, no progress bar. The
model is ``GPT2LMHeadModel`` on a ``GPT2Config`` built here (2 layers, width
64, 256 byte tokens); the text is the English-like corpus of
``gpt_adamw.py``, generated at start, character level. Nothing is
downloaded.

    torchrun --nproc-per-node 2 examples/hf_trainer_gpt.py
    gradwire profile --net bandwidth=200mbit --out prof -- torchrun --nproc-per-node 2 examples/hf_trainer_gpt.py
    gradwire compare --net bandwidth=200mbit -- torchrun --nproc-per-node 2 examples/hf_trainer_gpt.py --seed {seed}

The evaluation loss (``Trainer.evaluate`` every ``--eval-every`` steps and at
the end) goes into ``gradwire compare``'s table through ``gradwire.report``
(a no-op anywhere else; without gradwire installed the script runs as it
is). ``--summary FILE`` writes rank 0's optimizer steps and final metrics as JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_adamw import corpus  # noqa: E402  (the generated text, shared with gpt_adamw.py)

try:
    from gradwire import report
except ImportError:  # gradwire not installed: nothing to report to
    def report(step=None, **metrics):  # type: ignore[no-untyped-def]
        pass


class Windows(Dataset):
    """Fixed windows of ``seq`` bytes of the text; the labels are the inputs (the model shifts them)."""

    def __init__(self, data: torch.Tensor, seq: int) -> None:
        self.data, self.seq = data, seq

    def __len__(self) -> int:
        return (len(self.data) - 1) // self.seq

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        chunk = self.data[i * self.seq:(i + 1) * self.seq]
        return {"input_ids": chunk, "labels": chunk}


class ReportToGradwire(TrainerCallback):
    """Hands every evaluation's loss to ``gradwire.report`` (rank 0)."""

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):  # type: ignore[no-untyped-def]
        if state.is_world_process_zero and metrics and "eval_loss" in metrics:
            report(step=state.global_step, eval_loss=float(metrics["eval_loss"]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch", type=int, default=8, help="sequences per rank and step")
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--accumulate", type=int, default=1, help="gradient_accumulation_steps: micro-steps per step")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--eval-every", type=int, default=30)
    p.add_argument("--seed", type=int, default=42, help="the Trainer's seed (weights and data order)")
    p.add_argument("--summary", default=None, help="write rank 0's steps and final metrics to this JSON file")
    args = p.parse_args()

    data = corpus(120_000)
    split = int(len(data) * 0.9)
    train, val = Windows(data[:split], args.seq), Windows(data[split:], args.seq)
    config = GPT2Config(vocab_size=256, n_positions=args.seq, n_embd=64, n_layer=2, n_head=4,
                        bos_token_id=10, eos_token_id=10)
    with tempfile.TemporaryDirectory(prefix="hf-trainer-gpt-") as out:
        targs = TrainingArguments(output_dir=out, use_cpu=True, seed=args.seed, max_steps=args.steps,
                                  per_device_train_batch_size=args.batch, per_device_eval_batch_size=32,
                                  gradient_accumulation_steps=args.accumulate,
                                  learning_rate=args.lr, eval_strategy="steps", eval_steps=args.eval_every,
                                  logging_steps=args.eval_every, save_strategy="no", disable_tqdm=True)
        # model_init: the Trainer seeds first, then builds the model, so --seed sets the weights
        trainer = Trainer(model_init=lambda: GPT2LMHeadModel(config), args=targs, train_dataset=train,
                          eval_dataset=val, callbacks=[ReportToGradwire()])
        trainer.train()
        evals = [e for e in trainer.state.log_history if "eval_loss" in e]
        final = evals[-1] if evals and evals[-1]["step"] == trainer.state.global_step else trainer.evaluate()
    if trainer.is_world_process_zero():
        print(f"{trainer.state.global_step} optimizer steps on {targs.world_size} ranks: eval loss "
              f"{final['eval_loss']:.4f}", flush=True)
        if args.summary:
            with open(args.summary, "w") as f:
                json.dump({"optimizer_steps": trainer.state.global_step, "world": targs.world_size,
                           "param_bytes": sum(p.numel() * p.element_size() for p in trainer.model.parameters()),
                           "metrics": {k: float(v) for k, v in final.items()}}, f)


if __name__ == "__main__":
    main()
