"""Training loop and command line, with tiny settings (CPU, a few seconds)."""
import json
import math

import pytest
import torch

from mamba3.tasks import data, train


def test_curriculum_and_schedule():
    assert [train.curriculum_max(s, 100, 40, 160, 4) for s in (0, 24, 25, 50, 75, 99)] == [40, 40, 80, 120, 160, 160]
    assert train.curriculum_max(5, 100, 40, 160, 1) == 160
    assert train.lr_at(0, 100, 1.0, 10) == pytest.approx(0.1)
    assert train.lr_at(10, 100, 1.0, 10) == pytest.approx(1.0)
    assert train.lr_at(100, 100, 1.0, 10) == pytest.approx(0.1)
    lrs = train.lr_grid("8")
    assert len(lrs) == 8 and lrs[0] == pytest.approx(1e-4) and lrs[-1] == pytest.approx(1e-2)
    assert train.lr_grid("1e-3,2e-3") == [1e-3, 2e-3]


def test_short_training_run_lowers_the_loss(tmp_path):
    # modular arithmetic on expressions of 1 or 3 symbols ("d", "d op d"): learnable in a few dozen steps
    rc = train.main(["train", "arith", "--layers", "1", "--d-model", "32", "--d-state", "16", "--batch", "64",
                     "--steps", "40", "--lr", "2e-2", "--min-len", "1", "--max-len", "3", "--eval-len", "3",
                     "--eval-every", "5", "--n-val", "64", "--n-test", "64", "--test-lens", "3", "--device", "cpu",
                     "--out", str(tmp_path), "--quiet"])
    assert rc == 0
    res = json.loads((tmp_path / "results.json").read_text())
    hist = res["history"]
    assert hist[-1]["train_loss"] < 0.75 * hist[0]["train_loss"]
    assert res["best_val_acc"] > 0.4


def test_packed_training_follows_the_padded_run(tmp_path):
    """--pack yes (varlen batches, the CUDA default) trains the same model as --pack no, step for step."""
    hist = {}
    for pack in ("no", "yes"):
        out = tmp_path / pack
        rc = train.main(["parity", "--d-model", "16", "--d-state", "16", "--headdim", "8", "--steps", "6",
                         "--batch", "16", "--lr", "1e-2", "--max-len", "3:12", "--stages", "2", "--eval-len", "12",
                         "--eval-every", "1", "--n-val", "32", "--n-test", "16", "--test-lens", "6",
                         "--device", "cpu", "--pack", pack, "--out", str(out), "--quiet"])
        assert rc == 0
        hist[pack] = json.loads((out / "results.json").read_text())["history"]
    for a, b in zip(hist["no"], hist["yes"], strict=True):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-4)
        assert a["val_loss"] == pytest.approx(b["val_loss"], rel=1e-4)


RESUME_ARGS = ["parity", "--d-model", "16", "--d-state", "16", "--headdim", "8", "--steps", "7", "--batch", "16",
               "--lr", "1e-2", "--max-len", "3:12", "--stages", "2", "--eval-len", "12", "--eval-every", "2",
               "--n-val", "32", "--n-test", "16", "--test-lens", "6", "--device", "cpu", "--quiet"]


def run_paused_after_every_step(args: list[str], out) -> int:
    """Train with --stop-after 0 (a pause after every step, checkpoint_resume.pt) and --resume until the run has
    finished; the number of segments."""
    segments = 0
    while not (out / "results.json").exists():
        assert train.main(args + ["--out", str(out), "--stop-after", "0", "--resume"]) == 0
        segments += 1
        assert (out / "checkpoint_resume.pt").exists() != (out / "results.json").exists()
    return segments


def test_paused_and_resumed_run_equals_the_uninterrupted_run(tmp_path):
    """--stop-after 0 pauses after every step (checkpoint_resume.pt); resuming 7 times gives the same training
    history, best checkpoint and test results as one uninterrupted run."""
    assert train.main(RESUME_ARGS + ["--out", str(tmp_path / "straight")]) == 0
    assert run_paused_after_every_step(RESUME_ARGS, tmp_path / "paused") == 7
    a, b = (json.loads((tmp_path / d / "results.json").read_text()) for d in ("straight", "paused"))
    keys = ("step", "max_len", "lr", "train_loss", "train_acc", "grad_norm", "val_acc", "val_loss")
    assert [{k: h[k] for k in keys} for h in a["history"]] == [{k: h[k] for k in keys} for h in b["history"]]
    assert (a["best_step"], a["best_val_acc"], a["test"]) == (b["best_step"], b["best_val_acc"], b["test"])
    # the validation period may change on resume (validations change nothing): the same final weights
    out = tmp_path / "denser"
    assert train.main(RESUME_ARGS + ["--out", str(out), "--stop-after", "0"]) == 0
    assert train.main(RESUME_ARGS + ["--out", str(out), "--resume", "--eval-every", "1"]) == 0
    c = json.loads((out / "results.json").read_text())
    assert [h["step"] for h in c["history"]] == [2, 3, 4, 5, 6, 7]  # none at the pause after step 1
    last = [torch.load(tmp_path / d / "checkpoint_last.pt", weights_only=True)["model"]
            for d in ("straight", "denser")]
    assert all(torch.equal(last[0][k], last[1][k]) for k in last[0])
    # a checkpoint of another configuration is refused, not silently continued
    assert train.main(RESUME_ARGS[:-1] + ["--out", str(tmp_path / "other"), "--stop-after", "0"]) == 0
    with pytest.raises(ValueError, match="another configuration"):
        train.main(RESUME_ARGS + ["--out", str(tmp_path / "other"), "--resume", "--lr", "2e-2"])


def model_of_a_run_resumed_only_with(out, option: list[str], key: str, variant: str = "mamba3"):
    """A two-layer run started with ``option`` and paused; resuming it without the option is refused (``key`` is
    in its resume key), with it accepted. The model of the checkpoint it wrote."""
    args = RESUME_ARGS + ["--layers", "2", "--model", variant, "--out", str(out)]
    assert train.main(args + option + ["--stop-after", "0"]) == 0
    with pytest.raises(ValueError, match=key):
        train.main(args + ["--resume"])
    assert train.main(args + option + ["--resume"]) == 0
    model = train.load_checkpoint(out / "checkpoint_best.pt")
    assert len(model.layers) == 2
    return model


def test_a_activation_reaches_every_layer_and_the_checkpoint(tmp_path):
    """--a-activation softplus builds every Mamba3 layer with it, the checkpoint rebuilds them so, and a paused
    run does not resume under the other activation."""
    model = model_of_a_run_resumed_only_with(tmp_path / "softplus", ["--a-activation", "softplus"], "a_activation")
    assert all(block.mixer.a_activation == "softplus" for block in model.layers)


@pytest.mark.parametrize("variant", ["mamba3", "mimo"])
def test_outproj_norm_reaches_every_layer_and_the_checkpoint(tmp_path, variant):
    """--outproj-norm builds every Mamba3 layer with the headwise norm before the gate (SISO: in PyTorch, MIMO: in
    the operator), the checkpoint rebuilds them so, and a paused run does not resume without it."""
    model = model_of_a_run_resumed_only_with(tmp_path / variant, ["--outproj-norm"], "outproj_norm", variant)
    layers = [block.mixer for block in model.layers]
    assert all(m.is_outproj_norm and m.norm.weight.shape == (m.d_inner,) for m in layers)
    # the norm divides each head's output by its RMS, so scaling one head's x rows (the output is linear in them)
    # leaves the model's logits unchanged
    tokens = torch.randint(0, data.VOCAB_SIZE, (3, 12), generator=torch.Generator().manual_seed(0))
    query = torch.tensor([11, 7, 9])
    before = model(tokens, query)
    layer = layers[1]
    rows = layer.in_proj_slices()["x"]
    with torch.no_grad():
        layer.in_proj.weight[rows.start:rows.start + layer.headdim] *= 5.0
    torch.testing.assert_close(model(tokens, query), before, rtol=1e-4, atol=1e-5)


def test_weight_average_update():
    model = torch.nn.Linear(3, 2)
    start = [p.detach().clone() for p in model.parameters()]
    halves = {decay: train.WeightAverage(model, decay) for decay in (0.0, 0.75, 1.0)}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    for avg in halves.values():
        avg.update(model)
    for p0, p, a0, a75, a1 in zip(start, model.parameters(), *(h.model.parameters() for h in halves.values())):
        assert torch.equal(a0, p) and torch.equal(a1, p0)
        torch.testing.assert_close(a75, 0.75 * p0 + 0.25 * p, rtol=0, atol=1e-7)
        assert not a75.requires_grad
    with pytest.raises(ValueError, match="decay"):
        train.WeightAverage(model, 1.5)


def test_ema_is_validated_selected_and_tested_beside_the_trained_weights(tmp_path):
    """--ema 0: the average is the trained weights (same validations, selection and tests); --ema 1: it stays at the
    initial weights (one validation result throughout); the trained weights' selection does not depend on --ema;
    a paused run with the average resumes as the uninterrupted one, and not without --ema."""
    res = {}
    for decay in ("0", "1", "0.5"):
        assert train.main(RESUME_ARGS + ["--out", str(tmp_path / decay), "--ema", decay]) == 0
        res[decay] = json.loads((tmp_path / decay / "results.json").read_text())
    same, frozen, half = res["0"], res["1"], res["0.5"]
    assert [h["val_loss_ema"] for h in same["history"]] == [h["val_loss"] for h in same["history"]]
    assert {k: same["ema"][k] for k in ("best_step", "best_val_acc", "test", "test_pooled")} == {
        k: same[k] for k in ("best_step", "best_val_acc", "test", "test_pooled")}
    assert len({h["val_loss_ema"] for h in frozen["history"]}) == 1
    assert frozen["ema"]["best_step"] == 2  # the first validation; later ones tie
    torch.manual_seed(0)
    init = train.build_model(train.train_args("parity", RESUME_ARGS[1:]), "parity")
    saved = torch.load(tmp_path / "1" / "checkpoint_best_ema.pt", weights_only=True)["model"]
    assert all(torch.equal(saved[k], v) for k, v in init.state_dict().items())
    last = half["history"][-1]
    assert last["val_loss_ema"] not in (last["val_loss"], frozen["history"][0]["val_loss"])
    assert [h["val_loss"] for h in half["history"]] == [h["val_loss"] for h in frozen["history"]]
    assert (half["best_step"], half["test"]) == (frozen["best_step"], frozen["test"])
    assert run_paused_after_every_step(RESUME_ARGS + ["--ema", "0.5"], tmp_path / "paused") == 7
    paused = json.loads((tmp_path / "paused" / "results.json").read_text())
    assert [h["val_loss_ema"] for h in paused["history"]] == [h["val_loss_ema"] for h in half["history"]]
    assert paused["ema"] == half["ema"]
    model_of_a_run_resumed_only_with(tmp_path / "refused", ["--ema", "0.5"], "ema")


def test_cli_end_to_end_writes_json_and_checkpoints(tmp_path, capsys):
    out = tmp_path / "run"
    rc = train.main(["parity", "--model", "norope", "--d-model", "16", "--d-state", "16", "--headdim", "8",
                     "--steps", "3", "--batch", "8", "--max-len", "5:9", "--stages", "2", "--eval-len", "16",
                     "--n-val", "16", "--n-test", "16", "--test-lens", "8", "--device", "cpu", "--out", str(out)])
    assert rc == 0
    res = json.loads((out / "results.json").read_text())
    assert res["task"] == "parity" and res["model"] == "norope" and set(res["test"]) == {"8", "16"}
    assert 0.0 <= res["best_val_acc"] <= 1.0 and res["versions"]["torch"] == torch.__version__
    for name in ("checkpoint_best.pt", "checkpoint_last.pt"):
        model = train.load_checkpoint(out / name)
        assert model.config["variant"] == "norope"
    assert "| norope |" in capsys.readouterr().out
    # `train eval` on the best checkpoint reproduces the run's test results (same test sets, same backend)
    assert train.main(["eval", str(out / "checkpoint_best.pt"), "--device", "cpu"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[-3] == "| length | 8 | 16 |"
    assert table[-1] == "| scaled accuracy (%) | " + " | ".join(
        f"{100 * res['test'][L]['scaled']:.2f}" for L in ("8", "16")) + " |"
    # the pooled test (lengths uniform in [first curriculum maximum, eval length]), reproduced by `eval --pooled`
    assert res["test_pooled"]["lengths"] == [5, 16] and res["test_pooled"]["n"] == 16
    assert train.main(["eval", str(out / "checkpoint_best.pt"), "--device", "cpu", "--pooled", "5:16"]) == 0
    assert f"[5, 16]: {100 * res['test_pooled']['scaled']:.2f} %" in capsys.readouterr().out
    # several checkpoints: one table each, and with --plot one figure of all of them (where matplotlib is installed)
    png = tmp_path / "eval.png"
    assert train.main(["eval", str(out / "checkpoint_best.pt"), str(out / "checkpoint_last.pt"), "--device", "cpu",
                       "--lengths", "8", "--plot", str(png)]) == 0
    printed = capsys.readouterr().out
    assert printed.count("| length | 8 |") == 2 and "checkpoint_last.pt" in printed
    try:
        import matplotlib  # noqa: F401
        assert png.stat().st_size > 0
    except ImportError:
        assert "no plot" in printed and not png.exists()


def test_sweep_dry_run_and_summarize(tmp_path, capsys):
    rc = train.main(["sweep", "parity", "--models", "mamba3,norope", "--out", str(tmp_path), "--dry-run",
                     "--steps", "5"])
    assert rc == 0
    cmds = [l for l in capsys.readouterr().out.splitlines() if "mamba3.tasks train parity" in l]
    assert len(cmds) == 2 * 2 * 8 and all("--steps 5" in c and "--resume" in c for c in cmds)
    # summarize picks the best validation accuracy per (task, model)
    for lr, acc in ((1e-3, 0.7), (1e-2, 0.9)):
        d = tmp_path / f"r{lr}"
        d.mkdir()
        pooled = {"test_pooled": {"lengths": [40, 256], "scaled": 0.75}} if lr == 1e-2 else {}
        (d / "results.json").write_text(json.dumps(pooled | {
            "task": "parity", "model": "mamba3", "d_model": 32, "eval_len": 256, "lr": lr, "layers": 1, "seed": 0, "steps": 5,
            "best_val_acc": acc, "best_val_scaled": 2 * acc - 1, "test_scaled_at_eval_len": 0.5, "best_step": 5,
            "test": {"256": {"length": 256, "acc": acc, "scaled": 2 * acc - 1}}, "versions": {}, "machine": {},
            "command": "", "args": {"max_len": "40:160"}}))
    md = train.summarize(tmp_path)
    assert "| parity | mamba3 | 2 | 256 | 80.00 | 50.00 | 100.00 |" in md  # ours, its test, the paper's
    assert md.splitlines()[2].endswith("| 5 | 75.00 (40-256) |")  # the last columns: steps, its pooled test
    assert (tmp_path / "summary.json").exists()


def test_sweep_variants_run_the_grid_once_each_and_summarize_per_variant(tmp_path, capsys):
    rc = train.main(["sweep", "arith", "--d-models", "64", "--lrs", "2e-3", "--out", str(tmp_path), "--dry-run",
                     "--variant", "base=", "--variant", "nomlp-hd64=--mlp-ratio 0 --headdim 64", "--steps", "5"])
    assert rc == 0
    cmds = [l.split() for l in capsys.readouterr().out.splitlines() if "mamba3.tasks train arith" in l]
    assert len(cmds) == 2
    base, nomlp_hd64 = cmds
    assert base[base.index("--out") + 1] == str(tmp_path / "arith" / "mamba3" / "base" / "d64_lr2.00e-03_s0")
    assert base[-2:] == ["--tag", "base"] and "--mlp-ratio" not in base and base[base.index("--steps") + 1] == "5"
    assert nomlp_hd64[-6:] == ["--mlp-ratio", "0", "--headdim", "64", "--tag", "nomlp-hd64"]
    with pytest.raises(SystemExit):  # a repeated name would share a directory
        train.main(["sweep", "arith", "--out", str(tmp_path), "--dry-run", "--variant", "a=", "--variant", "a=-x"])
    with pytest.raises(SystemExit):  # a variant cannot leave its directory's d_model / lr / seed
        train.main(["sweep", "arith", "--out", str(tmp_path), "--dry-run", "--variant", "d32=--d-model=32"])
    # one summary row per variant, the better variant not hiding the other; a run's weight average (--ema) is a
    # row of its own
    for tag, acc in (("base", 0.6), ("nomlp", 0.9), (None, 0.7)):
        d = tmp_path / f"r{tag}"
        d.mkdir()
        ema = {"ema": {"best_step": 4, "best_val_acc": 0.68, "best_val_scaled": 0.6, "test_scaled_at_eval_len": 0.55,
                       "test": {"256": {"length": 256, "acc": 0.64, "scaled": 0.55}}}} if tag == "nomlp" else {}
        (d / "results.json").write_text(json.dumps(ema | {
            "task": "arith", "model": "mamba3", "d_model": 64, "eval_len": 256, "lr": 2e-3, "layers": 3, "seed": 0,
            "steps": 5, "best_val_acc": acc, "best_val_scaled": (acc - 0.2) / 0.8, "test_scaled_at_eval_len": 0.5,
            "best_step": 5, "test": {"256": {"length": 256, "acc": acc, "scaled": (acc - 0.2) / 0.8}},
            "versions": {}, "machine": {}, "command": "", "args": {"max_len": "40:160", "tag": tag}}))
    md = train.summarize(tmp_path)
    assert "| arith | mamba3 | 1 | 256 | 62.50 |" in md
    assert "| arith | mamba3 [base] | 1 | 256 | 50.00 |" in md
    assert "| arith | mamba3 [nomlp] | 1 | 256 | 87.50 | 50.00 |" in md
    assert "| arith | mamba3 [nomlp+ema] | 1 | 256 | 60.00 | 55.00 |" in md and "Rows tagged +ema" in md
    assert [r["tag"] for r in json.loads((tmp_path / "summary.json").read_text())] == [
        None, "base", "nomlp", "nomlp+ema"]


def test_usage_errors():
    assert train.main([]) == 2
    assert train.main(["nonsense"]) == 2


DIVERGE_ARGS = ["parity", "--d-model", "16", "--d-state", "16", "--headdim", "8", "--steps", "40", "--batch", "8",
                "--max-len", "3:8", "--eval-len", "8", "--eval-every", "2", "--n-val", "16", "--n-test", "16",
                "--test-lens", "4", "--device", "cpu", "--quiet"]


def test_diverged_run_stops_and_reports_its_best_checkpoint(tmp_path, capsys, poison_gradients_from):
    """A run whose training loss becomes NaN (here: NaN gradients injected from the 5th step on) stops at the next
    validation instead of training on, and is reported from its best (finite) checkpoint, with the step it
    diverged at."""
    calls = poison_gradients_from(5)
    out = tmp_path / "run"
    rc = train.main(DIVERGE_ARGS + ["--out", str(out)])
    assert rc == 0
    res = json.loads((out / "results.json").read_text())
    hist = res["history"]
    # step 5's update makes the weights NaN; step 6's loss is NaN, seen at the validation after step 6
    assert res["diverged_at_step"] == res["steps_trained"] == hist[-1]["step"] == 6 and len(calls) == 6
    assert not math.isfinite(hist[-1]["train_loss"]) and all(math.isfinite(h["train_loss"]) for h in hist[:-1])
    assert 0 < res["best_step"] <= 4 and math.isfinite(res["test_scaled_at_eval_len"])
    assert all(torch.isfinite(p).all() for p in train.load_checkpoint(out / "checkpoint_best.pt").parameters())
    assert "not finite at step 6" in capsys.readouterr().err
    assert "40 (diverged at 6)" in train.summarize(tmp_path)


def test_run_diverged_before_any_finite_validation(tmp_path, capsys, poison_gradients_from):
    """No finite validation: no best checkpoint (a stale one from an earlier run in --out is not used), no best
    validation accuracy in results.json and the summary ('–')."""
    poison_gradients_from(1)
    out = tmp_path / "run"
    out.mkdir()
    torch.save({"model": {}}, out / "checkpoint_best.pt")  # an earlier run's file: must be ignored
    assert train.main(DIVERGE_ARGS + ["--out", str(out)]) == 0
    res = json.loads((out / "results.json").read_text())
    assert res["diverged_at_step"] == 2 and res["best_step"] == 0 and res["best_val_scaled"] is None
    assert "no finite validation" in capsys.readouterr().err
    assert "| parity | mamba3 | 1 | 8 | – |" in train.summarize(tmp_path)


def test_eval_by_depth_splits_the_test_sets(tmp_path, capsys):
    out = tmp_path / "run"
    assert train.main(["arith_brackets", "--d-model", "16", "--d-state", "16", "--headdim", "8", "--layers", "1",
                       "--steps", "2", "--batch", "8", "--max-len", "5:9", "--stages", "1", "--eval-len", "24",
                       "--n-val", "16", "--n-test", "40", "--test-lens", "12", "--device", "cpu",
                       "--out", str(out)]) == 0
    res = json.loads((out / "results.json").read_text())
    capsys.readouterr()
    assert train.main(["eval", str(out / "checkpoint_best.pt"), "--device", "cpu", "--by-depth"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [line for line in lines if line.startswith("| ") and line.split("|")[1].strip().isdigit()]
    assert rows, lines
    for col, L in enumerate(("12", "24")):  # per length: the depth rows hold every string, and their accuracies
        n, right = 0, 0.0                     # average to the length's own accuracy
        for line in rows:
            cell = line.split("|")[2 + col].strip()
            if cell:
                scaled, count = cell.split(" (")
                count = int(count.rstrip(")"))
                n += count
                right += count * (0.2 + 0.8 * float(scaled) / 100)
        assert n == 40
        assert abs(right / n - res["test"][L]["acc"]) < 2e-3
    parity = _parity_checkpoint(tmp_path)
    with pytest.raises(SystemExit):  # parity strings have no brackets: refused
        train.main(["eval", str(parity), "--device", "cpu", "--by-depth"])
    assert "needs arith_brackets checkpoints, not parity" in capsys.readouterr().err


def test_pooled_evaluation_over_mixed_lengths(tmp_path, capsys):
    """Grazzi et al.'s protocol: one accuracy over strings of lengths uniform in [lo, hi], evaluated in padded
    slices of mixed lengths; it must equal the strings evaluated one by one, unpadded."""
    ckpt = _parity_checkpoint(tmp_path)
    model = train.load_checkpoint(ckpt)
    ts = train.pooled_set("parity", 40, 5, 24, False)
    assert int(ts.lengths.min()) >= 5 and int(ts.lengths.max()) <= 24 and ts.lengths.unique().numel() > 5
    res = train.pooled_results(model, "parity", 5, 24, 40, False, "cpu", eval_batch=16)
    right, loss = 0, 0.0
    for r in range(40):
        q = int(ts.query[r])
        one = data.Batch(ts.tokens[r:r + 1, :q + 1], ts.query[r:r + 1], ts.target[r:r + 1], ts.lengths[r:r + 1])
        ok, row_loss = train.row_results(model, one, "cpu")
        right, loss = right + int(ok.sum()), loss + row_loss
    assert res["acc"] == right / 40 and res["scaled"] == data.scaled_accuracy(right / 40, "parity")
    assert res["loss"] == pytest.approx(loss / 40, rel=1e-5)
    capsys.readouterr()
    assert train.main(["eval", str(ckpt), "--device", "cpu", "--n", "40", "--pooled", "5:24"]) == 0
    assert (f"pooled over 40 strings of lengths uniform in [5, 24]: {100 * res['scaled']:.2f} %"
            in capsys.readouterr().out)


def _parity_checkpoint(tmp_path):
    out = tmp_path / "parity"
    assert train.main(["parity", "--d-model", "16", "--d-state", "16", "--headdim", "8", "--steps", "1",
                       "--batch", "8", "--max-len", "3:5", "--stages", "1", "--eval-len", "8", "--n-val", "8",
                       "--n-test", "8", "--test-lens", "4", "--device", "cpu", "--out", str(out)]) == 0
    return out / "checkpoint_best.pt"


def _small_args(**kw):
    from types import SimpleNamespace

    return SimpleNamespace(**{"lr": 1e-2, "weight_decay": 0.5, "dynamics_weight_decay": None, **kw})


def test_dynamics_weight_decay_rows():
    from mamba3.tasks.models import TaskModel

    model = TaskModel(13, 5, d_model=16, n_layers=2, d_state=16, headdim=8)
    opt = train.make_optimizer(model, _small_args(dynamics_weight_decay=0.0), torch.device("cpu"))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)  # Adam's update is 0: what changes is the weight decay alone
    opt.step()
    factor = torch.tensor(1 - 1e-2 * 0.5, dtype=torch.float32)
    for i, block in enumerate(model.layers):
        rows = block.mixer.in_proj_slices()
        w, w0 = block.mixer.in_proj.weight.detach(), before[f"layers.{i}.mixer.in_proj.weight"]
        dyn = torch.zeros(w.shape[0], dtype=torch.bool)
        dyn[rows["dd_dt"]] = dyn[rows["dd_A"]] = True
        assert torch.equal(w[dyn], w0[dyn])
        assert torch.equal(w[~dyn], w0[~dyn] * factor)
        assert torch.equal(block.mlp.fc1.weight.detach(), before[f"layers.{i}.mlp.fc1.weight"] * factor)


def test_dynamics_weight_decay_equal_to_weight_decay_trains_as_adamw(tmp_path):
    common = ["arith", "--d-model", "16", "--d-state", "16", "--headdim", "8", "--layers", "2", "--steps", "6",
              "--batch", "8", "--max-len", "5:9", "--stages", "1", "--eval-len", "9", "--eval-every", "3",
              "--n-val", "8", "--n-test", "8", "--test-lens", "5", "--device", "cpu", "--weight-decay", "0.5",
              "--lr", "1e-2"]
    assert train.main(common + ["--out", str(tmp_path / "a")]) == 0
    assert train.main(common + ["--out", str(tmp_path / "b"), "--dynamics-weight-decay", "0.5"]) == 0
    assert train.main(common + ["--out", str(tmp_path / "c"), "--dynamics-weight-decay", "0"]) == 0
    a, b, c = (torch.load(tmp_path / r / "checkpoint_last.pt", weights_only=True)["model"] for r in "abc")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)
