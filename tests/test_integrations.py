"""docs/integrations.md's examples (docs/examples/): torch-rechub's MMOE with bce+pdaom per task and
with a LaA ranking head, TorchRec's DLRM and DeepFM with AUCLoss(groups=...), a plain PyTorch loop
and a LightningCLI whose YAML picks the loss by class_path. Each trains a few steps on batches of
whole users and its loss must fall; the doc's code blocks must be the scripts' code."""

from __future__ import annotations

import importlib.util
import math
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "docs" / "examples"
DOC = ROOT / "docs" / "integrations.md"
STEPS = 30


def load_example(name: str):
    """docs/examples/<name>.py as a module (run as a script it is ``__main__``)."""
    spec = importlib.util.spec_from_file_location(f"mlloss_example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # LightningCLI resolves the classes' module by name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def one_thread(monkeypatch):
    """The examples' models are tiny: a second intra-op thread only spins, and on a busy 2-core
    machine it makes a step 20 times slower. (And LightningCLI(args=...) must not see pytest's argv.)"""
    monkeypatch.setattr(sys, "argv", ["example.py"])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def assert_falls(losses: list[float]) -> None:
    assert len(losses) == STEPS
    assert all(math.isfinite(value) for value in losses), losses
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < first and last < losses[0], f"the loss did not fall: first steps {losses[:5]}, last steps {losses[-5:]}"


# --------------------------------------------------------------------------------- torch-rechub


@pytest.mark.parametrize("objective", ["bce+pdaom", "ranking-head"])
def test_torch_rechub_mmoe(objective, capsys):
    pytest.importorskip("torch_rechub", reason="torch-rechub is not installed (pip install torch-rechub)")
    example = load_example("torch_rechub_mmoe")
    assert_falls(example.main(steps=STEPS, objective=objective))
    log = capsys.readouterr().out
    if objective == "bce+pdaom":  # one objective per task: per-task parts are logged
        assert "'bce/1'" in log and "'ranking/1'" in log
    else:
        assert "'laa'" in log


def test_torch_rechub_batches_hold_whole_users():
    """The loader of the example, as the doc builds it: torch-rechub's (x_dict, y) batches, each
    user in exactly one batch of the epoch."""
    pytest.importorskip("torch_rechub", reason="torch-rechub is not installed (pip install torch-rechub)")
    from torch.utils.data import DataLoader
    from torch_rechub.utils.data import TorchDataset

    from mlloss.data import GroupBatchSampler, SyntheticConfig, generate_impressions

    example = load_example("torch_rechub_mmoe")
    x, y, features = example.rechub_inputs(generate_impressions(SyntheticConfig(num_users=50, mean_impressions=10)))
    largest_user = int(torch.bincount(x["user"]).max())  # larger users would be split in pieces
    loader = DataLoader(TorchDataset(x, y), sampler=GroupBatchSampler(x["user"], largest_user), batch_size=None)
    seen: set[int] = set()
    assert len(loader) > 2
    for x_batch, y_batch in loader:
        assert set(x_batch) == {f.name for f in features} and y_batch.shape == (len(x_batch["user"]), 2)
        users = set(x_batch["user"].tolist())
        assert not users & seen
        seen |= users
    assert seen == set(x["user"].tolist())


# ------------------------------------------------------------------------------------- TorchRec


@pytest.mark.parametrize("arch", ["dlrm", "deepfm"])
def test_torchrec(arch):
    pytest.importorskip("torchrec", reason="the torchrec extra is not installed (docs/torchrec.md)")
    example = load_example("torchrec_dlrm")
    assert_falls(example.main(steps=STEPS, arch=arch))


def test_torchrec_deepfm_gives_probabilities():
    """Why the example tells the BCE that SimpleDeepFMNN gives probabilities: its over arch ends in
    a sigmoid, although its docstring says logits; with the default inputs="logits" the loss warns."""
    pytest.importorskip("torchrec", reason="the torchrec extra is not installed (docs/torchrec.md)")
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.models.deepfm import SimpleDeepFMNN

    import mlloss
    from mlloss import BCELoss

    example = load_example("torchrec_dlrm")
    keys = ["user", "item"]
    tables = [EmbeddingBagConfig(name=f"t_{k}", embedding_dim=4, num_embeddings=10, feature_names=[k]) for k in keys]
    model = SimpleDeepFMNN(num_dense_features=3, embedding_bag_collection=EmbeddingBagCollection(tables=tables),
                           hidden_layer_size=8, deep_fm_dimension=4)
    torch.manual_seed(0)
    scores = model(torch.randn(32, 3), example.to_kjt(torch.randint(0, 10, (32, 2)), keys))
    assert scores.shape == (32, 1) and bool(((scores > 0) & (scores < 1)).all())
    loss, labels = BCELoss(), torch.randint(0, 2, (32,)).float()
    mlloss._validation._probability_like_batches = 0  # the warning counts batches in a row, per process
    for _ in range(mlloss._validation.PROBABILITY_WARNING_BATCHES - 1):
        loss(scores, labels)
    with pytest.warns(UserWarning, match="inputs='probabilities'"):
        loss(scores, labels)


# ---------------------------------------------------------------------------------- plain loop


@pytest.mark.parametrize("loss_name", ["bce+auc", "laa"])
def test_plain_pytorch(loss_name):
    example = load_example("plain_pytorch")
    assert_falls(example.main(steps=STEPS, loss_name=loss_name))


# ----------------------------------------------------------------------------------- LightningCLI


def test_lightning_cli_fits_with_the_yaml_loss():
    pytest.importorskip("pytorch_lightning", reason="pytorch-lightning is not installed")
    pytest.importorskip("jsonargparse", reason='LightningCLI needs "jsonargparse[signatures]"')
    example = load_example("lightning_cli")
    assert_falls(example.main(steps=STEPS))


def test_lightning_cli_command_line():
    """The doc's command, with the loss swapped on the command line."""
    pytest.importorskip("pytorch_lightning", reason="pytorch-lightning is not installed")
    pytest.importorskip("jsonargparse", reason='LightningCLI needs "jsonargparse[signatures]"')
    command = [sys.executable, "docs/examples/lightning_cli.py", "fit", "--config", "docs/examples/lightning_cli.yaml",
               "--trainer.max_steps=3", "--model.loss=mlloss.LoALoss", "--model.loss.weights=balanced"]
    run = subprocess.run(command, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"},
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "`max_steps=3` reached" in run.stdout + run.stderr


def test_lightning_cli_selects_the_loss_by_class_path():
    pytest.importorskip("pytorch_lightning", reason="pytorch-lightning is not installed")
    pytest.importorskip("jsonargparse", reason='LightningCLI needs "jsonargparse[signatures]"')
    from pytorch_lightning.cli import LightningCLI

    from mlloss import LaALoss, LoALoss

    example = load_example("lightning_cli")

    def configured_loss(*args):
        cli = LightningCLI(example.Ranker, example.ImpressionLog, args=["--config", str(example.CONFIG), *args],
                           run=False, save_config_callback=None)
        return cli.model.loss

    loss = configured_loss()
    assert type(loss) is LaALoss and loss.weights.tolist() == [1.0, 2.0] and loss.cost == "linear"
    loss = configured_loss("--model.loss=mlloss.LoALoss", "--model.loss.weights=balanced")
    assert type(loss) is LoALoss and loss.balanced


# ------------------------------------------------------------------------------------------ doc


def doc_blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", DOC.read_text(), flags=re.S | re.M)


def test_doc_code_is_the_examples_code():
    """Every python block of docs/integrations.md is a run of lines of an example (at any
    indentation), and the yaml block is the example's YAML."""
    scripts = {path.name: path.read_text() for path in EXAMPLES.glob("*.py")}
    blocks = doc_blocks("python")
    assert len(blocks) >= 5
    for block in blocks:
        indented = [textwrap.indent(block, " " * n) for n in range(0, 13, 4)]
        assert any(text in script for script in scripts.values() for text in indented), f"not in docs/examples/:\n{block}"
    assert doc_blocks("yaml") == [(EXAMPLES / "lightning_cli.yaml").read_text()]
    for name in [*scripts, "lightning_cli.yaml"]:
        assert f"(examples/{name})" in DOC.read_text(), f"docs/integrations.md does not link docs/examples/{name}"
