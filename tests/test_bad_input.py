"""Every bad argument or input fails early, with the argument's name and the offending value."""

from __future__ import annotations

import os
import re

import pytest
import torch

import mlloss

SCORES = torch.tensor([0.1, 0.4, -0.3, 0.8])
LABELS = torch.tensor([1.0, 0.0, 1.0, 0.0])


@pytest.mark.parametrize(
    "build,error,message",
    [
        (lambda: mlloss.AUCLoss(surrogate="logit"), ValueError, "surrogate must be one of .*got 'logit'"),
        (lambda: mlloss.LaALoss(surrogate=None), ValueError, "surrogate must be one of .*got None"),
        (lambda: mlloss.AUCLoss(pairs="hard"), ValueError, "pairs must be one of .*got 'hard'"),
        (lambda: mlloss.AUCLoss(reduction="none"), ValueError, "reduction must be one of .*got 'none'"),
        (lambda: mlloss.AUCLoss(backend="cuda"), ValueError, "backend must be one of .*got 'cuda'"),
        (lambda: mlloss.AUCLoss(margin=float("nan")), ValueError, "margin must be a finite number; got nan"),
        (lambda: mlloss.AUCLoss(temperature=0.5), ValueError, "temperature=0.5 .* needs pairs='hardest'"),
        (lambda: mlloss.AUCLoss(pairs="hardest", temperature=-1.0), ValueError, "temperature must be a positive"),
        (lambda: mlloss.AUCLoss(pairs="hardest", temperature=1e-310), ValueError,
         r"temperature must be at least 2.22507e-308 \(a normal float64\); got 1e-310"),
        (lambda: mlloss.AUCLoss(backend="exact"), ValueError, "backend='exact' needs a surrogate with a closed form"),
        (lambda: mlloss.AUCLoss(cross_device="yes"), TypeError, "cross_device must be a bool; got 'yes'"),
        (lambda: mlloss.LoALoss([1.0, -0.5]), ValueError, r"weights must all be >= 0; got \[1.0, -0.5\]"),
        (lambda: mlloss.LoALoss([0.0, 0.0]), ValueError, "weights must not all be zero"),
        (lambda: mlloss.LoALoss(label_names=["x", "x"]), ValueError, r"label_names must be distinct .*; got \['x', 'x'\]"),
        (lambda: mlloss.LoALoss("balance"), ValueError, "got 'balance'"),
        (lambda: mlloss.LoALoss([1.0], priors=[0.5]), ValueError, "priors are only used with weights='balanced'"),
        (lambda: mlloss.LoALoss("balanced", priors=[0.5, 1.0]), ValueError, r"priors must lie in \(0, 1\)"),
        (lambda: mlloss.LaALoss([1.0, 0.0]), ValueError, r"weights must all be > 0; got \[1.0, 0.0\]"),
        (lambda: mlloss.LaALoss([1.0, float("inf")]), ValueError, "weights must be finite"),
        (lambda: mlloss.LaALoss(["a"]), TypeError, "weights must be a sequence of numbers"),
        (lambda: mlloss.LaALoss(cost="quadratic"), ValueError, "cost must be one of .*got 'quadratic'"),
        (lambda: mlloss.build_loss("bce+pdaom", lam=-1.0), ValueError,
         "lam must be a finite number >= 0 or a non-empty sequence of them; got -1.0"),
        (lambda: mlloss.build_loss("bce+auc", lam=float("inf")), ValueError,
         "lam must be a finite number >= 0 or a non-empty sequence of them; got inf"),
        (lambda: mlloss.build_loss("bce+auc", lam=[]), ValueError,
         r"lam must be a finite number >= 0 or a non-empty sequence of them; got \[\]"),
        (lambda: mlloss.build_loss("bce+pdaom", lam=[1.0, -2.0]), ValueError, r"lam must be .*got \[1.0, -2.0\]"),
        (lambda: mlloss.build_loss("bce", inputs="probs"), ValueError, "inputs must be one of .*got .probs."),
        (lambda: mlloss.LaALoss(real_levels=1), TypeError, "real_levels must be a bool; got 1"),
        (lambda: mlloss.build_loss(3), TypeError, "name must be a string"),
        # found by review: each built without complaint and failed (or misbehaved) later
        (lambda: mlloss.BCEPlusRanking(None), TypeError, "ranking must be a pairwise loss module .*got None"),
        (lambda: mlloss.BCEPlusRanking("pdaom"), TypeError, r"got 'pdaom'; for a loss by name use mlloss.build_loss\('bce\+pdaom'\)"),
        (lambda: mlloss.LoALoss(1), TypeError, "weights must be a sequence of numbers, one per label; got 1"),
        (lambda: mlloss.LoALoss([[1, 2]]), TypeError, r"weights must be a sequence of numbers, one per label; got \[\[1, 2\]\]"),
        (lambda: mlloss.LoALoss([True, False]), TypeError, "one per label; got \\[True, False\\]"),
        (lambda: mlloss.LoALoss(label_names="cp"), ValueError, "label_names must be a sequence of names, .*not one string; got 'cp'"),
        (lambda: mlloss.LoALoss([1.0, 2.0], num_labels=3), ValueError, r"weights has 2 entries but num_labels=3"),
        (lambda: mlloss.LoALoss("balanced", priors=[0.1, 0.2], num_labels=3), ValueError, r"priors has 2 entries but num_labels=3"),
        # found by an audit of the API: contradictions visible at construction, refused there
        (lambda: mlloss.LoALoss([1.0, 2.0], label_names=["click", "buy", "share"]), ValueError,
         r"must agree on the number of labels; got \{'weights': 2, 'label_names': 3\}"),
        (lambda: mlloss.LoALoss("balanced", num_labels=2, label_names=["click", "buy", "share"]), ValueError,
         r"got \{'num_labels': 2, 'label_names': 3\}"),
        (lambda: mlloss.LoALoss("balanced", priors=[0.2, 0.05], label_names=["click"]), ValueError,
         r"got \{'priors': 2, 'label_names': 1\}"),
    ],
)
def test_bad_constructor_arguments_fail_in_init(build, error, message):
    with pytest.raises(error, match=message):
        build()


@pytest.mark.parametrize(
    "call,error,message",
    [
        (lambda loss: loss([0.1, 0.2], LABELS[:2]), TypeError, "scores must be a torch.Tensor; got list"),
        (lambda loss: loss(torch.tensor([1, 2]), LABELS[:2]), TypeError, "scores must be a floating-point tensor; got dtype torch.int64"),
        (lambda loss: loss(SCORES[None, :], LABELS), ValueError, r"scores of shape \(N,\) or \(N, 1\), or \(N, K\) with labels of shape \(N, K\).*got scores of shape \(1, 4\) and labels of shape \(4,\)"),
        (lambda loss: loss(torch.tensor([0.1, float("nan"), 0.2, 0.3]), LABELS), ValueError, r"scores must be finite; scores\[1\] = nan"),
        (lambda loss: loss(torch.tensor([0.1, 0.2, float("inf"), 0.3]), LABELS), ValueError, r"scores\[2\] = inf"),
        (lambda loss: loss(SCORES, LABELS[:3]), ValueError, "labels have 3 rows but scores have 4 items"),
        (lambda loss: loss(SCORES, torch.tensor([1.0, 0.0, 2.0, 0.0])), ValueError, r"labels must be binary \(0/1\); labels\[2\] = 2.0"),
        (lambda loss: loss(SCORES, torch.tensor([1.0, 0.0, 0.5, 0.0])), ValueError, r"labels\[2\] = 0.5"),
        (lambda loss: loss(SCORES, torch.tensor([1.0, float("nan"), 0.0, 0.0])), ValueError, r"labels must be finite; labels\[1\] = nan"),
        (lambda loss: loss(SCORES, LABELS, torch.tensor([0.0, 1.0, 0.0, 1.0])), TypeError, "groups must hold integer ids; got dtype torch.float32"),
        (lambda loss: loss(SCORES, LABELS, torch.tensor([True, False, True, True])), TypeError, "groups must hold integer ids; got dtype torch.bool"),
        (lambda loss: loss(SCORES, LABELS, torch.tensor([0, 1, 0])), ValueError, "groups have 3 entries but scores have 4 items"),
        (lambda loss: loss(SCORES, LABELS, [0, 1, 0, 1]), TypeError, "groups must be a torch.Tensor of integer ids or None; got list"),
        (lambda loss: loss(SCORES, torch.stack([LABELS, LABELS], 1)), ValueError, "AUCLoss takes one binary label column; got labels with 2 columns"),
    ],
)
def test_bad_batches_fail_with_the_argument_and_value(call, error, message):
    with pytest.raises(error, match=message):
        call(mlloss.AUCLoss())


def test_weights_of_the_wrong_length_name_both_sizes():
    labels = torch.stack([LABELS, 1 - LABELS, LABELS], 1)
    with pytest.raises(ValueError, match=r"weights has 2 entries but labels have 3 columns"):
        mlloss.LoALoss([1.0, 2.0])(SCORES, labels)
    with pytest.raises(ValueError, match=r"weights has 2 entries but labels have 3 columns"):
        mlloss.LaALoss([1.0, 2.0])(SCORES, labels)
    with pytest.raises(ValueError, match=r"priors has 2 entries but labels have 3 columns"):
        mlloss.LoALoss("balanced", priors=[0.2, 0.5])(SCORES, labels)


@pytest.mark.parametrize("build", [mlloss.AUCLoss, mlloss.LaALoss, mlloss.PDAOMLoss, lambda: mlloss.LoALoss("balanced")])
def test_a_batch_beyond_the_int32_layout_is_refused_by_its_size(build):
    # 2^31 items as a stride-0 view (no memory): the size is refused before the layout would index
    # past its int32 positions.
    scores = torch.zeros(1).expand(2**31)
    labels = torch.zeros(1, dtype=torch.long).expand(2**31)
    with pytest.raises(ValueError, match=r"at most 2\*\*31 - 1 = 2,147,483,647 items per call .*got 2,147,483,648"):
        build()(scores, labels)


def test_several_label_columns_must_be_binary_for_laa_but_one_column_may_be_ordinal():
    ratings = torch.tensor([4.0, 0.0, 2.0, 3.0])
    assert mlloss.LaALoss()(SCORES, ratings) > 0
    with pytest.raises(ValueError, match=r"labels with several columns must be binary \(0/1\); labels\[0, 0\] = 4.0"):
        mlloss.LaALoss()(SCORES, torch.stack([ratings, LABELS], 1))
    with pytest.raises(ValueError, match=r"labels must be binary \(0/1\); labels\[0\] = 4.0"):
        mlloss.LoALoss()(SCORES, ratings)


def test_reprs_show_the_options_that_differ_from_the_defaults():
    """A printed model says how its losses were built: the options set away from their defaults."""
    assert repr(mlloss.BCELoss()) == "BCELoss()"
    assert repr(mlloss.BCELoss(inputs="probabilities", validate_args=False)) == \
        "BCELoss(inputs='probabilities', validate_args=False)"
    assert "validate_args=False" in repr(mlloss.AUCLoss(validate_args=False))
    assert "validate_args" not in repr(mlloss.AUCLoss())


def test_loa_and_laa_reprs_show_their_objective():
    # LoALoss() and LoALoss("balanced"), LaALoss() and LaALoss(cost="uniform") printed the same.
    reprs = [repr(loss) for loss in (
        mlloss.LoALoss(), mlloss.LoALoss("balanced"), mlloss.LoALoss([1, 9]), mlloss.LoALoss(label_names=["c", "p"]),
        mlloss.LaALoss(), mlloss.LaALoss([1, 5]), mlloss.LaALoss(cost="uniform"), mlloss.LaALoss(real_levels=True),
    )]
    assert len(set(reprs)) == len(reprs)
    assert "weights=[1.0, 9.0]" in reprs[2] and "weights='balanced'" in reprs[1] and "cost='uniform'" in reprs[6]


def test_ranking_metrics_refuse_names_that_would_lose_a_label():
    from mlloss.evaluation import ranking_metrics

    scores, labels = torch.randn(20), torch.randint(0, 2, (20, 2))
    # ["a", "a"] returned one auc/a, the second label's; "cp" named two labels "c" and "p"
    with pytest.raises(ValueError, match=r"label_names must be distinct .*got \['a', 'a'\]"):
        ranking_metrics(scores, labels, label_names=["a", "a"])
    with pytest.raises(ValueError, match="not one string; got 'cp'"):
        ranking_metrics(scores, labels, label_names="cp")
    # an empty split: NaN metrics (as the metrics it wraps give), not a reshape error
    with pytest.warns(mlloss.metrics.UndefinedMetricWarning):
        empty = ranking_metrics(torch.zeros(0), torch.zeros(0, 2), label_names=["a", "b"])
    assert set(empty) == {"auc/a", "auc/b", "diff_auc", "min_auc", "multipartite_auc"}
    assert all(torch.isnan(value) for value in empty.values())


def test_laa_weights_at_the_ends_of_float64_give_the_loss_of_weights_one():
    # LaA's costs are divided by their group's sum: scaling every weight changes nothing. Weights of
    # 1e-320 (subnormal levels) gave 0.0 on every tier, and 1e308 (an infinite sum) 0.0 or an OverflowError.
    gen = torch.Generator().manual_seed(4)
    scores, labels = torch.randn(30, generator=gen, dtype=torch.float64), torch.randint(0, 2, (30, 2), generator=gen)
    groups = torch.arange(30) // 6
    for cost in ("linear", "uniform"):
        expected = mlloss.LaALoss(cost=cost)(scores, labels, groups)
        for weights in ([1e-320, 1e-320], [1e308, 1e308], [2.0**-1000, 2.0**-1000], [3.0, 3.0]):
            torch.testing.assert_close(mlloss.LaALoss(weights, cost=cost)(scores, labels, groups), expected, rtol=1e-12, atol=0)
        # a power of two changes no bit
        assert torch.equal(mlloss.LaALoss([2.0**-600, 2.0**-601], cost=cost)(scores, labels, groups),
                           mlloss.LaALoss([1.0, 0.5], cost=cost)(scores, labels, groups))
    # ordinary weights go to the op as they are: weights [1, 1] are the default's bits, on the
    # exponential closed form's log-costs too
    for surrogate in ("logistic", "exponential", "squared", "hinge"):
        assert torch.equal(mlloss.LaALoss([1.0, 1.0], surrogate=surrogate)(scores * 0.1, labels, groups),
                           mlloss.LaALoss(surrogate=surrogate)(scores * 0.1, labels, groups))


def test_numpy_scalars_are_numbers():
    # np.float32(0.5) was refused with "must be a positive finite number; got np.float32(0.5)".
    np = pytest.importorskip("numpy")
    scores, labels, groups = torch.randn(12, dtype=torch.float64), torch.arange(12) % 2, torch.arange(12) // 4
    numpy_loss = mlloss.AUCLoss(pairs="hardest", temperature=np.float32(0.5), margin=np.int64(2), surrogate="hinge")
    plain_loss = mlloss.AUCLoss(pairs="hardest", temperature=0.5, margin=2, surrogate="hinge")
    assert torch.equal(numpy_loss(scores, labels, groups), plain_loss(scores, labels, groups))
    assert mlloss.build_loss("bce+pdaom", lam=np.float32(2.0)).lam == 2.0
    assert mlloss.build_loss("bce+pdaom", lam=[np.int64(1), np.float64(0.5)]).lam == (1.0, 0.5)
    # The value as repr writes it: np.True_ with NumPy 2, True with NumPy 1.
    with pytest.raises(ValueError, match=re.escape(f"temperature must be a positive finite number or None; got {np.True_!r}")):
        mlloss.AUCLoss(pairs="hardest", temperature=np.True_)


DEVICE = os.environ.get("MLLOSS_TEST_DEVICE", "cpu")  # MLLOSS_TEST_DEVICE=cuda: the Triton tier compiled
BACKENDS = ["torch", pytest.param("triton", marks=pytest.mark.triton)]
_BAD_ENTRIES = {  # (the entry at [2, 1], its message)
    "nan logit": ("scores", float("nan"), r"scores must be finite; scores\[2, 1\] = nan"),
    "inf logit": ("scores", float("inf"), r"scores must be finite; scores\[2, 1\] = inf"),  # sigmoid(inf) is 1
    "-inf logit": ("scores", -float("inf"), r"scores must be finite; scores\[2, 1\] = -inf"),
    "label 2": ("labels", 2.0, r"labels must be binary \(0/1\); labels\[2, 1\] = 2.0"),
    "label 0.5": ("labels", 0.5, r"labels must be binary \(0/1\); labels\[2, 1\] = 0.5"),
    "nan label": ("labels", float("nan"), r"labels must be finite; labels\[2, 1\] = nan"),
}


@pytest.mark.parametrize("bad", sorted(_BAD_ENTRIES))
@pytest.mark.parametrize("name", ["bce", "bce+auc", "bce+pdaom"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("masked", [False, True])
def test_the_cross_entropy_objectives_name_a_bad_entry_on_every_path(bad, name, backend, masked):
    # bce+auc and bce+pdaom make the cross-entropy's check and the ranking's in one op, read
    # together on the Triton tier: the cross-entropy's messages, about the logits the caller passed.
    if backend == "triton":
        pytest.importorskip("triton")
    generator = torch.Generator().manual_seed(3)
    scores = torch.randn(8, 2, generator=generator, dtype=torch.float64)
    labels = torch.tensor([[1.0, 0.0], [0.0, 1.0]] * 4)
    groups, mask = torch.arange(8) // 4, None
    if masked:  # a filler row holding garbage is never named
        mask = torch.ones(8, dtype=torch.bool)
        mask[5] = False
        scores[5], labels[5] = float("nan"), 7.0
    which, value, message = _BAD_ENTRIES[bad]
    (scores if which == "scores" else labels)[2, 1] = value
    scores, labels, groups = scores.to(DEVICE), labels.to(DEVICE), groups.to(DEVICE)
    mask = None if mask is None else mask.to(DEVICE)
    options = {} if name == "bce" else {"backend": backend}
    loss = mlloss.build_loss(name, **options)
    with pytest.raises(ValueError, match=message):
        loss(scores, labels, groups, mask=mask)
    if which == "labels" and value == 2.0:  # integer labels: the same rule, the same message
        with pytest.raises(ValueError, match=message):
            loss(scores, labels.long(), groups, mask=mask)


@pytest.mark.parametrize("value", [1.5, -0.25, float("nan"), float("inf")])
@pytest.mark.parametrize("name", ["bce", "bce+auc", "bce+pdaom"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_probabilities_outside_0_1_are_named_before_torch_refuses_them(value, name, backend):
    # torch's cross-entropy of probabilities refuses a value outside [0, 1] (on CUDA a device-side
    # assert); the check, read once after the op, names it first.
    if backend == "triton":
        pytest.importorskip("triton")
    probabilities = torch.sigmoid(torch.randn(8, 2, generator=torch.Generator().manual_seed(4), dtype=torch.float64))
    probabilities[2, 1] = value
    labels, groups = torch.tensor([[1.0, 0.0], [0.0, 1.0]] * 4), torch.arange(8) // 4
    probabilities, labels, groups = probabilities.to(DEVICE), labels.to(DEVICE), groups.to(DEVICE)
    options = {"inputs": "probabilities"} if name == "bce" else {"inputs": "probabilities", "backend": backend}
    with pytest.raises(ValueError, match=rf"scores must be probabilities in \[0, 1\] \(inputs='probabilities'\); "
                                         rf"scores\[2, 1\] = {value}"):
        mlloss.build_loss(name, **options)(probabilities, labels, groups)


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.int8, torch.int32, torch.int64,
                                   torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_label_violations_counts_exactly_the_labels_that_break_each_rule(dtype):
    # The data check's count (one op and a count_nonzero) against the comparisons it replaces, on
    # values a dtype holds near 0 and 1, its extremes, and NaN and infinities for floating labels.
    from mlloss._validation import label_violations

    if dtype == torch.bool:
        assert label_violations(torch.tensor([True, False]), "binary") is None  # cannot break the rule
        return
    if dtype.is_floating_point:
        info = torch.finfo(dtype)
        near = [0.0, 1.0, -0.0, info.tiny, -info.tiny, info.eps, 1 - info.eps / 2, 1 + info.eps, 2.0, 0.5, -1.0,
                info.max, -info.max, float("nan"), float("inf"), -float("inf"), 1e-45]
    else:
        info = torch.iinfo(dtype)
        near = [0, 1, 2, info.max, info.min, info.max - 1, info.min + 1, 16, 256 % (info.max + 1)]
        near = [v for v in near if info.min <= v <= info.max]
    values = torch.tensor(near, dtype=torch.float64).to(dtype)
    wide = values.double()
    expected = {  # the rules of LABEL_RULES, written out
        "binary": (wide != 0) & (wide != 1),
        "integer": ~torch.isfinite(wide) | (wide != torch.round(wide)),
        "real": ~torch.isfinite(wide),
    }
    for rule, bad in expected.items():
        if rule != "binary" and not dtype.is_floating_point:  # integers are whole and finite
            assert label_violations(values, rule) is None
            continue
        for value, value_bad in zip(values, bad):
            labels = torch.zeros(5, 2, dtype=dtype)
            labels[3, 1] = value
            assert int(label_violations(labels, rule)) == int(value_bad), (rule, dtype, value)
        assert int(label_violations(values, rule)) == int(bad.sum()), rule


TWO_LABELS = torch.stack([LABELS, 1 - LABELS], 1)


@pytest.mark.parametrize("build,labels", [(mlloss.AUCLoss, LABELS), (mlloss.LaALoss, TWO_LABELS),
                                          (lambda: mlloss.LoALoss("balanced"), TWO_LABELS), (mlloss.BCELoss, LABELS),
                                          (lambda: mlloss.build_loss("bce+pdaom"), LABELS)])
@pytest.mark.parametrize("where", ["labels", "groups", "mask"])
def test_labels_groups_and_mask_on_another_device_are_named(build, labels, where):
    # the meta device stands in for scores on CUDA and an input left on the CPU: the error names
    # the input and both devices instead of an internal device or copy error
    inputs = {"labels": labels, "groups": torch.tensor([0, 0, 1, 1]), "mask": torch.ones(4, dtype=torch.bool)}
    inputs[where] = inputs[where].to("meta")
    with pytest.raises(ValueError, match=rf"{where} must be on the scores' device \(cpu\); got meta"):
        build()(SCORES, inputs["labels"], inputs["groups"], mask=inputs["mask"])


def test_bce_checks_the_groups_it_ignores():
    # a mask passed positionally lands in groups: BCELoss used to drop it silently (the fillers
    # counted in the mean); it is now refused as the ranking losses refuse it, with a hint
    mask = torch.tensor([True, True, False, True])
    with pytest.raises(TypeError, match=r"groups must hold integer ids; got dtype torch.bool \(a bool mask .* goes in mask=\)"):
        mlloss.BCELoss()(SCORES, LABELS, mask)
    with pytest.raises(ValueError, match="groups have 3 entries but scores have 4 items"):
        mlloss.BCELoss()(SCORES, LABELS, torch.tensor([0, 1, 0]))
    torch.testing.assert_close(mlloss.BCELoss()(SCORES, LABELS, torch.tensor([0, 1, 0, 1])), mlloss.BCELoss()(SCORES, LABELS),
                               rtol=0, atol=0)


def test_loa_num_labels_is_checked_against_every_batch():
    with pytest.raises(ValueError, match=r"labels have 2 columns but num_labels=3; got labels of shape \(4, 2\)"):
        mlloss.LoALoss(num_labels=3)(SCORES, TWO_LABELS)
    torch.testing.assert_close(mlloss.LoALoss(num_labels=2)(SCORES, TWO_LABELS), mlloss.LoALoss()(SCORES, TWO_LABELS),
                               rtol=0, atol=0)
