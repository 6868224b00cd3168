"""The README's examples run, and print what the README says they print."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import torch

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()
BLOCKS = re.findall(r"```(\w*)\n(.*?)```", README, flags=re.S)


def python_block(containing: str) -> str:
    return next(code for lang, code in BLOCKS if lang == "python" and containing in code)


def test_label_dictatorship_example_prints_the_readme_output():
    code = python_block("label_dictatorship(labels")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "README.md", "exec"), {})
    shown = next(code for lang, code in BLOCKS if lang == "" and "dictates the LoA ranking" in code)
    assert printed.getvalue().strip() == shown.strip()


def test_lightning_example_trains():
    import pytorch_lightning as pl

    namespace: dict = {}
    exec(compile(python_block("class Ranker"), "README.md", "exec"), namespace)
    gen = torch.Generator().manual_seed(0)
    features = torch.randn(256, 5, generator=gen)
    labels = (torch.rand(256, 2, generator=gen) < torch.sigmoid(features[:, :2])).float()
    users = torch.randint(0, 16, (256,), generator=gen)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(features, labels, users), batch_size=64)
    model = namespace["Ranker"](num_features=5)
    before = [p.detach().clone() for p in model.parameters()]
    trainer = pl.Trainer(max_epochs=2, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, data)
    assert torch.isfinite(trainer.callback_metrics["train/laa"])
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
