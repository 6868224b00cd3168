"""The docs name code that exists, and their snippets that no other test runs do what they say.

tests/test_readme.py runs the README's python blocks, tests/test_readme_commands.py its commands,
tests/test_integrations.py docs/integrations.md's examples, tests/test_torchrec.py the example of
docs/torchrec.md and tests/test_sampler.py that of docs/sampler.md. Here:

* every code name a doc writes in backquotes as a dotted path (``reduce.combine``,
  ``kernels.check.check_batch``, ``dispatch.pair_loss``) is a module of mlloss and an attribute
  of it, defined in that module (a name only imported there is named where it is defined), and
  every file path it gives exists: docs/architecture.md is a map of the code, and a map with
  stale names sends readers to the wrong file;
* every ``--option`` of the recipe's docs is an option of ``recipes/ctr_cvr.py``;
* docs/checkpoints.md's "In your own training script" block trains, writes its checkpoint, and a
  second run of the same block resumes from it.
"""

from __future__ import annotations

import importlib
import re
import sys
import warnings
from pathlib import Path
from types import ModuleType

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Where a doc's short module names live: ``dispatch`` is mlloss.ops.dispatch, ``dense`` mlloss.kernels.dense.
PACKAGES = ("mlloss", "mlloss.ops", "mlloss.kernels", "mlloss.integrations", "mlloss.models", "mlloss.data",
            "mlloss.metrics")
FILE_SUFFIXES = (".py", ".md", ".yaml", ".sh", ".toml")


def _prose(path: Path) -> str:
    """The doc without its fenced code blocks (they are run, not read as names)."""
    return re.sub(r"```.*?```", "", path.read_text(), flags=re.S)


def _spans(path: Path) -> list[str]:
    return sorted(set(re.findall(r"`([^`\s]+)`", _prose(path))))


def _module(name: str) -> ModuleType | None:
    try:
        with warnings.catch_warnings():  # the docs name the deprecated aliases too (mlloss.towers)
            warnings.simplefilter("ignore", DeprecationWarning)
            return importlib.import_module(name)
    except ImportError:  # not a module (or an extra that is not installed: triton for mlloss.kernels)
        return None


def _name_problem(span: str) -> str | None:
    """Why the dotted name ``span`` does not resolve (None when it does, or when it does not start
    with a module of mlloss: ``loss.parts``, ``torch.compile``). The longest module prefix wins."""
    parts = span.replace("/", ".").split(".")
    for package in ("", *PACKAGES):
        for cut in range(len(parts), 0, -1):
            name = ".".join(filter(None, [package, *parts[:cut]]))
            if not name.startswith("mlloss") or (module := _module(name)) is None:
                continue
            owner: object = module
            for depth, attribute in enumerate(parts[cut:]):
                if not hasattr(owner, attribute):
                    return f"{name} has no attribute {attribute!r}"
                owner = getattr(owner, attribute)
                defined_in = getattr(owner, "__module__", None)
                if (depth == 0 and not hasattr(module, "__path__") and callable(owner)
                        and str(defined_in).startswith("mlloss") and defined_in != name):
                    return f"{name}.{attribute} is defined in {defined_in}, not {name}"
            return None
    return None


def _dotted_names(path: Path) -> list[str]:
    return [span for span in _spans(path)
            if re.fullmatch(r"[A-Za-z_]\w*(/\w+)*(\.[A-Za-z_]\w*)+", span) and not span.endswith(FILE_SUFFIXES)]


def _file_paths(path: Path) -> list[str]:
    """The file paths a doc gives (``mlloss/{towers,lightning}.py`` is two)."""
    paths = []
    for span in _spans(path):
        if braces := re.fullmatch(r"([\w./-]*)\{([\w,]+)\}(\.\w+)", span):
            paths += [braces[1] + name + braces[3] for name in braces[2].split(",")]
        elif re.fullmatch(r"[\w./-]+", span) and span.endswith(FILE_SUFFIXES) and "<" not in span:
            paths.append(span)
    return paths


def _exists(path: str) -> bool:
    """A path from the root, docs/ (a doc's links) or mlloss/ (``ops/pointwise.py``); a bare file
    name anywhere in the package or the kernels."""
    if "/" in path or (ROOT / path).exists():
        return any((base / path).exists() for base in (ROOT, ROOT / "docs", ROOT / "mlloss"))
    return any(any(base.rglob(path)) for base in (ROOT / "mlloss", ROOT / "kernels", ROOT / "recipes", ROOT / "tests",
                                                  ROOT / "benchmarks", ROOT / "docs"))


@pytest.mark.parametrize("doc", DOCS, ids=lambda path: path.name)
def test_docs_name_code_that_exists(doc):
    names, paths = _dotted_names(doc), _file_paths(doc)
    problems = [f"`{name}`: {problem}" for name in names if (problem := _name_problem(name))]
    problems += [f"`{path}`: no such file" for path in paths if not _exists(path)]
    assert not problems, f"{doc.relative_to(ROOT)} names code that does not exist:\n" + "\n".join(problems)


def test_the_architecture_map_is_checked():
    """The check above reads what docs/architecture.md names: dozens of dotted names and files."""
    doc = ROOT / "docs" / "architecture.md"
    assert len(_dotted_names(doc)) >= 30 and len(_file_paths(doc)) >= 25
    assert _name_problem("pairwise.combine") == ("mlloss.kernels.pairwise.combine is defined in mlloss.kernels.reduce, "
                                                 "not mlloss.kernels.pairwise") or _module("triton") is None
    assert _name_problem("dispatch.no_such_function") == "mlloss.ops.dispatch has no attribute 'no_such_function'"
    assert _name_problem("mlloss.build_loss") is None  # re-exported by a package: fine


LINKED_DOCS = [*DOCS, ROOT / "benchmarks" / "README.md"]


def _heading_anchors(path: Path) -> set[str]:
    """The anchors GitHub gives the Markdown headings of ``path``: lower case, punctuation dropped
    (hyphens and underscores kept), spaces as hyphens."""
    headings = re.findall(r"^#+ +(.+?) *$", _prose(path), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


@pytest.mark.parametrize("doc", LINKED_DOCS, ids=lambda path: str(path.relative_to(ROOT)))
def test_docs_links_reach_a_file_and_its_heading(doc):
    """Every relative link ``[text](path#anchor)`` of the docs opens a file of the repository, and
    its anchor, if any, is one of that file's headings: text moved between the README and the
    docs leaves no link to a section that is gone."""
    problems = []
    for target in re.findall(r"\]\(([^)\s]+)\)", _prose(doc)):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        linked = (doc.parent / path).resolve() if path else doc
        if not linked.exists():
            problems.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in _heading_anchors(linked):
            problems.append(f"{target}: no heading of {linked.relative_to(ROOT)} has the anchor #{anchor}")
    assert not problems, f"{doc.relative_to(ROOT)} links to what is not there:\n" + "\n".join(problems)


def test_heading_anchors_follow_github():
    assert _heading_anchors(ROOT / "benchmarks" / "README.md") >= {
        "results-cpu", "the-gpu-path-measured-on-the-cpu", "the-default-recipe-with-each-loss-recipe_lossespy"}


@pytest.mark.parametrize("doc", ["recipe.md", "checkpoints.md"])
def test_recipe_docs_name_recipe_options(doc):
    sys.path.insert(0, str(ROOT / "recipes"))
    try:
        options_module = importlib.import_module("ctr_cvr_options")
    finally:
        sys.path.remove(str(ROOT / "recipes"))
    parser = options_module.build_parser()
    options = {string for action in parser._actions for string in action.option_strings}
    named = set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", (ROOT / "docs" / doc).read_text()))
    assert len(named) >= 10
    assert not named - options, f"docs/{doc} names options recipes/ctr_cvr.py does not have: {sorted(named - options)}"


def test_checkpoints_doc_example_trains_and_resumes(tmp_path, monkeypatch):
    pl = pytest.importorskip("pytorch_lightning", reason="the lightning extra is not installed")
    text = (ROOT / "docs" / "checkpoints.md").read_text()
    code = next(block for block in re.findall(r"```python\n(.*?)```", text, flags=re.S) if "AtomicCheckpointIO" in block)
    assert "max_epochs=10," in code
    monkeypatch.chdir(tmp_path)

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch[0]).square().mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = pl.LightningDataModule.from_datasets(torch.utils.data.TensorDataset(torch.randn(8, 2)), batch_size=4)

    def run(epochs: int) -> pl.Trainer:
        quiet = "logger=False, enable_progress_bar=False, enable_model_summary=False"
        namespace = {"model": Tiny(), "data": data}
        exec(compile(code.replace("max_epochs=10,", f"max_epochs={epochs}, {quiet},"), "docs/checkpoints.md", "exec"),
             namespace)
        return namespace["trainer"]

    first = run(1)
    assert (tmp_path / "ckpt" / "last.ckpt").is_file() and first.global_step == 2
    assert not (tmp_path / "ckpt" / ".partial").exists()
    resumed = run(2)  # ckpt_path=latest_complete_checkpoint("ckpt"): continues the first run
    assert resumed.current_epoch == 2 and resumed.global_step == 4
    saved = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=False)
    assert saved["epoch"] == 1 and saved["global_step"] == 4
