"""mtxrun --transparent, end to end: uneven batches, model forms (scripts/model_forms.py),
random draws, stops, weights changed outside the optimizer, backup and restore, child
processes, epoch iterators, ranks given different arrays. Runs in ONE plain process, like
test_transparent.py (in the same session)."""

import os
import re

import numpy as np
import pytest
from mtxrun_jobs import (
    JOB_TIMEOUT,
    SCRIPTS,
    Job,
    jobs_together,
    mtxrun,
    plain_beside_transparent,
)

# A job of model_forms.py running several forms (forms_job below).
FORMS_TIMEOUT = 600


def test_transparent_uneven_batches_report_the_1_process_logs(tmp):
    # 97 rows, batches of 32 over 3 ranks: every batch splits unevenly (11/11/10, the last 1/0/0).
    # The weights and also the logs fit() reports must be the 1-process run's.
    import json

    script = os.path.join(SCRIPTS, "uneven_logs.py")
    plain_beside_transparent(tmp, script, "uneven", 3)
    one = json.loads((tmp / "uneven1.0.json").read_text())
    three = [json.loads((tmp / f"uneven3.{r}.json").read_text()) for r in range(3)]
    for r in range(3):
        assert three[r]["weights"] == three[0]["weights"], (
            f"rank {r}'s weights differ from rank 0's"
        )
        for key in ("loss", "mae"):
            np.testing.assert_allclose(
                three[r]["history"][key],
                one["history"][key],
                rtol=1e-5,
                err_msg=f"rank {r}: History['{key}'] vs the 1-process run",
            )
    for a, b in zip(three[0]["weights"], one["weights"]):
        np.testing.assert_allclose(np.array(a), np.array(b), atol=1e-5)


def test_transparent_train_on_batch_after_a_numpy_fit(tmp):
    # fit() gives Keras the rows as indices; train_on_batch then gets the rows themselves and
    # must train on them (cut over the ranks, averaged): the 1-process result, on every rank.
    import json

    script = os.path.join(SCRIPTS, "uneven_logs.py")
    plain_beside_transparent(tmp, script, "tob", 2, "train_on_batch")
    one = json.loads((tmp / "tob1.0.json").read_text())
    two = [json.loads((tmp / f"tob2.{r}.json").read_text()) for r in range(2)]
    assert one["train_on_batch"] is not None
    assert two[1]["weights"] == two[0]["weights"], "the ranks' weights differ"
    for a, b in zip(two[0]["weights"], one["weights"]):
        np.testing.assert_allclose(np.array(a), np.array(b), atol=1e-5)


MODEL_FORMS = [
    ("dict_outputs", 2),
    ("dict_weights", 2),
    ("batch_norm", 2),
    ("batch_norm", 3),
    ("fit_twice", 2),
    ("ratio_metrics", 2),
    ("ratio_metrics", 3),
    ("custom_step", 2),
    ("checkpoints", 2),
    ("loss_forms", 3),
    ("stop_on_rank0", 2),
    ("guide_steps", 2),
    ("save_reload", 2),
    ("state_forms", 2),
    ("state_forms", 3),
    ("two_optimizers", 2),
]


@pytest.fixture(scope="module")
def forms_job(tmp):
    """forms_job(np_): the job running model_forms.py's forms of MODEL_FORMS at np_ ranks (1: the
    1-process run of every form, in plain python), launched once. One process per rank runs
    the forms one after the other (the script imports each form afresh): the TensorFlow import,
    not the forms' training, is most of a job's time."""
    jobs = {}
    (tmp / "one").mkdir()

    def spec(np_):
        forms = list(dict.fromkeys(f for f, n in MODEL_FORMS if np_ == 1 or n == np_))
        argv = ["python", os.path.join(SCRIPTS, "model_forms.py"), "{form}%d.{rank}.json" % np_]
        if np_ > 1:
            argv = mtxrun() + ["-np", str(np_), "--transparent"] + argv
        # The 1-process run beside the first N-rank job: in a folder of its own (the forms
        # save to fixed names, such as m.keras).
        return dict(
            argv=argv + forms, cwd=str(tmp / "one" if np_ == 1 else tmp), timeout=FORMS_TIMEOUT
        )

    def get(np_):
        want = [n for n in dict.fromkeys((1, np_)) if n not in jobs]
        if want:
            jobs.update(zip(want, jobs_together(*[spec(n) for n in want])))
        return jobs[np_]

    return get


@pytest.mark.parametrize("form,np_", MODEL_FORMS)
def test_transparent_model_forms_follow_the_1_process_run(tmp, forms_job, form, np_):
    # Dict targets and sample weights (a two-output functional model), BatchNormalization,
    # whose batch statistics must be the global batch's, two fits on different arrays and a
    # save then load, ratio and weighted metrics and train_on_batch/test_on_batch, per-output
    # and custom loss trackers over unevenly split batches, checkpoints loaded after fit and
    # steps_per_execution, a summed loss and a metric whose result is its state variable,
    # keras.io's custom steps (nested metric logs), saves reloaded at once by ranks that reach
    # them late, a summed loss with regularizers, a layer's own moving statistics, a train
    # step given x alone, a GAN's two optimizers: every rank's weights, moving statistics, History
    # and predictions equal the
    # 1-process run's (scripts/model_forms.py).
    import json

    forms_job(1).check_ok()
    forms_job(np_).check_ok()
    if form == "checkpoints":
        assert (tmp / f"{form}{np_}.exported" / "saved_model.pb").exists(), "no SavedModel"
    one = json.loads((tmp / "one" / f"{form}1.0.json").read_text())
    many = [json.loads((tmp / f"{form}{np_}.{r}.json").read_text()) for r in range(np_)]
    for r in range(np_):
        assert many[r]["weights"] == many[0]["weights"], f"rank {r}'s weights differ from rank 0's"
        for a, b in zip(many[r]["weights"], one["weights"]):
            np.testing.assert_allclose(
                np.array(a),
                np.array(b),
                atol=1e-4,
                err_msg=f"{form}: rank {r} vs the 1-process run",
            )
        for a, b in zip(many[r]["predict"], one["predict"]):
            np.testing.assert_allclose(
                np.array(a), np.array(b), atol=1e-4, err_msg=f"{form}: rank {r}'s predict()"
            )
        assert set(many[r]["history"]) == set(one["history"]), (form, r)
        for key, values in one["history"].items():
            np.testing.assert_allclose(
                many[r]["history"][key],
                values,
                rtol=1e-4,
                err_msg=f"{form}: History['{key}'] on rank {r}",
            )


def test_transparent_random_draws_differ_across_ranks_and_rank_0_draws_the_1_process_ones(tmp):
    # Dropout masks and draws from a SeedGenerator inside the train step: each rank's rows must
    # get their own (with one seed, row i of every rank's share got the same mask); rank 0's
    # are the 1-process run's; a draw with an integer seed stays the same everywhere; the
    # weights stay equal on every rank (scripts/draws.py).
    import json

    script = os.path.join(SCRIPTS, "draws.py")
    plain_beside_transparent(tmp, script, "draws", 3)
    one = json.loads((tmp / "draws1.0.json").read_text())
    many = [json.loads((tmp / f"draws3.{r}.json").read_text()) for r in range(3)]
    assert np.array(one["drawn"]).any() and np.array(one["masks"]).any(), "nothing was drawn"
    for key in ("masks", "drawn", "fixed"):
        assert many[0][key] == one[key], f"rank 0's {key} differ from the 1-process run's"
    for r in (1, 2):
        assert many[r]["fixed"] == many[0]["fixed"], "an integer-seeded draw differs by rank"
        assert many[r]["weights"] == many[0]["weights"], f"rank {r}'s weights differ"
        for key in ("masks", "drawn"):
            a, b = np.array(many[r][key]), np.array(many[0][key])
            # Every step's draw differs (a mask of 16 units agrees by chance with 2**-16).
            assert all((a[i] != b[i]).any() for i in range(len(a))), (
                f"rank {r}'s {key} repeat rank 0's: {a.tolist()} vs {b.tolist()}"
            )
    assert many[1]["drawn"] != many[2]["drawn"], "ranks 1 and 2 drew alike"


@pytest.mark.parametrize("mode", ["nan", "lambda"])
def test_transparent_a_stop_in_one_rank_share_stops_every_rank_at_that_batch(tmp, mode):
    # Per-batch logs are each rank's share: a planted row on rank 1 makes only its callback
    # stop, in the middle of the epoch (TerminateOnNaN; a LambdaCallback, whose hooks are set
    # on the instance). Every rank must stop after that batch, as the 1-process run does
    # (without the agreement rank 0 waited in the next batch's allreduce until the stall
    # timeout; scripts/batch_stop.py).
    import json

    script = os.path.join(SCRIPTS, "batch_stop.py")
    plain_beside_transparent(
        tmp, script, "stop", 2, mode, extra_env={"MTXCOMM_STALL_TIMEOUT": "60"}
    )
    one = json.loads((tmp / "stop1.0.json").read_text())
    assert one == {"steps": 3, "epochs": 1, "all_nan": mode == "nan"}, one
    for r in range(2):
        assert json.loads((tmp / f"stop2.{r}.json").read_text()) == one, r


def test_transparent_weights_changed_outside_the_optimizer_fail_every_rank(tmp):
    # A train_step that assigns the weights itself: each rank applies its own half batch's
    # gradient, the ranks drift apart, and after the first epoch every rank raises, naming the
    # variable, instead of training on and predicting with a mix of the two models.
    script = os.path.join(SCRIPTS, "model_forms.py")
    # Each rank's output in a file of its own (Open MPI's --output-filename): the two ranks'
    # tracebacks interleave on a shared stderr.
    logs = tmp / "logs"
    job = Job(
        mtxrun()
        + [
            "-np",
            "2",
            "--transparent",
            "--mpi-args",
            "--output-filename " + str(logs),
            "python",
            script,
            "manual.{rank}.json",
            "manual_update",
        ],
        cwd=str(tmp),
        timeout=JOB_TIMEOUT,
    )
    assert not job.timed_out and job.returncode != 0, job.describe()
    for r in range(2):
        stderr = next(logs.glob(f"**/rank.{r}/stderr")).read_text()
        errors = re.findall(
            r"RuntimeError: mtxrun --transparent: after epoch 1 the ranks hold "
            r"different values of (\S+)",
            stderr,
        )
        assert len(errors) == 1 and ("kernel" in errors[0] or "bias" in errors[0]), (r, stderr)
    assert not list(tmp.glob("manual.*.json")), "a rank went on to write its results"


def test_transparent_backup_and_restore_resumes_every_rank_like_the_1_process_run(tmp):
    # BackupAndRestore runs on rank 0 only; when a job interrupted after epoch 2 starts again,
    # rank 0 restores the weights and the epoch, and every rank must take both (before, the
    # other ranks started from epoch 0 and the job hung until the stall timeout).
    import json

    script = os.path.join(SCRIPTS, "resume.py")
    for np_, launch in ((1, ["python"]), (2, mtxrun() + ["-np", "2", "--transparent", "python"])):
        work = tmp / f"resume{np_}"
        work.mkdir()
        first = Job(
            launch + [script, "first.{rank}.json", "interrupt"], cwd=str(work), timeout=JOB_TIMEOUT
        )
        assert not first.timed_out and first.returncode != 0, first.describe()
        assert "preempted after epoch 2" in first.stderr, first.describe()
        assert (work / "backup").is_dir(), first.describe()
        Job(
            launch + [script, "resumed.{rank}.json", "resume"], cwd=str(work), timeout=JOB_TIMEOUT
        ).check_ok()
    one = json.loads((tmp / "resume1" / "resumed.0.json").read_text())
    assert one["epochs"] == [2, 3, 4], one["epochs"]
    for r in range(2):
        many = json.loads((tmp / "resume2" / f"resumed.{r}.json").read_text())
        assert many["epochs"] == [2, 3, 4], (r, many["epochs"])
        np.testing.assert_allclose(many["history"]["loss"], one["history"]["loss"], rtol=1e-4)
        for a, b in zip(many["weights"], one["weights"]):
            np.testing.assert_allclose(
                np.array(a), np.array(b), atol=1e-4, err_msg=f"rank {r} vs the 1-process run"
            )


def test_transparent_python_children_stay_ordinary_processes(tmp):
    # A rank's Python child (a subprocess importing Keras) inherited the transparent mode and
    # Open MPI's rank variables: it failed in MPI_Init, and the ranks then never exited.
    job = Job(
        mtxrun()
        + [
            "-np",
            "2",
            "--transparent",
            "--all-ranks-output",
            "python",
            os.path.join(SCRIPTS, "child_process.py"),
        ],
        cwd=str(tmp),
        timeout=180,
    )
    job.check_ok()
    for r in range(2):
        path = tmp / ("child.%d" % r)
        assert path.exists(), job.describe()
        assert path.read_text().split("\n") == ["CHILD 0 0", "DONE %d" % r, ""], (
            "rank %d wrote %r\n%s" % (r, path.read_text(), job.describe())
        )


def test_transparent_epochs_draw_the_rows_of_the_1_process_run_from_one_iterator(tmp):
    # NumPy input: the batches of row indices come from one iterator for the whole fit. A
    # script with a seed gets the 1-process run's rows at every step of every epoch and fit
    # (Keras repeats one permutation under a seed); shuffle=False gets the rows in order; a
    # script without a seed gets a new permutation every epoch, the same on every rank (a
    # 1-process run without a seed reshuffles every epoch). Each rank trains on its contiguous
    # share of each step's rows (scripts/epoch_order.py); 45 rows, batches of 8: a last batch
    # of 5, at 2 and 3 ranks.
    import json

    script = os.path.join(SCRIPTS, "epoch_order.py")

    def run(*jobs):
        """Runs JOBS, each (NP, [(NAME, ARGS), ...]): epoch_order.py's runs one after the other
        in ONE job (one TensorFlow import per rank), the jobs at the same time; returns, for
        each job, {NAME: [rank 0's record, ...]}."""
        specs = []
        for np_, runs in jobs:
            argv = ["python", script]
            for i, (name, extra) in enumerate(runs):
                argv += (["--then"] if i else []) + [name + ".{rank}.json", *extra]
            if np_ is not None:
                argv = mtxrun() + ["-np", str(np_), "--transparent"] + argv
            specs.append(dict(argv=argv, cwd=str(tmp), timeout=JOB_TIMEOUT))
        out = []
        for job, (np_, runs) in zip(jobs_together(*specs), jobs):
            job.check_ok()
            # Keras warns when a dataset comes with shuffle=True; the script passes arrays.
            assert "will be ignored" not in job.stderr, job.describe()
            out.append(
                {
                    name: [
                        json.loads((tmp / f"{name}.{r}.json").read_text()) for r in range(np_ or 1)
                    ]
                    for name, _ in runs
                }
            )
        return out

    def joined(ranks):
        """Each step's rows, the ranks' shares in rank order, checking the shares are the
        contiguous [B*r/N, B*(r+1)/N) parts (a rank with none trains on one row weighted 0)."""
        n = len(ranks)
        out = []
        for f in range(len(ranks[0])):
            epochs = []
            for e in range(len(ranks[0][f])):
                steps = []
                for s in range(len(ranks[0][f][e])):
                    parts = [ranks[r][f][e][s] for r in range(n)]
                    total = sum(len(part) for part in parts)
                    whole = []
                    for r, part in enumerate(parts):
                        want = total * (r + 1) // n - total * r // n
                        if want:
                            assert len(part) == want, (f, e, s, r, parts)
                            whole += part
                    steps.append(whole)
                epochs.append(steps)
            out.append(epochs)
        return out

    seeded = ["--seed", "5", "--fits", "2"]
    # steps_per_execution: 3 divides the 6 steps of an epoch, 4 does not (its second execution
    # of an epoch takes the 2 batches left).
    spe = {k: ["--seed", "5", "--steps-per-execution", str(k)] for k in (3, 4)}
    ones, twos = run(
        (None, [("order_seeded_1p", seeded)] + [(f"order_spe{k}_1p", spe[k]) for k in spe]),
        (
            2,
            [("order_seeded_2", seeded)]
            + [(f"order_spe{k}_2", spe[k]) for k in spe]
            + [("order_noshuffle", ["--no-shuffle", "--epochs", "2"])],
        ),
    )
    # The run without a seed first in its job: it draws as a script that never seeds does.
    (threes,) = run((3, [("order_unseeded", ["--fits", "2"]), ("order_seeded_3", seeded)]))

    one = ones["order_seeded_1p"][0]
    assert len(one) == 2 and all(len(f) == 3 for f in one)
    assert all(sorted(sum(e, [])) == list(range(45)) for f in one for e in f)
    for np_, runs in ((2, twos), (3, threes)):
        many = joined(runs[f"order_seeded_{np_}"])
        assert many == one, f"np={np_}: the rows of some step differ from the 1-process run's"

    for k in spe:
        one = ones[f"order_spe{k}_1p"][0]
        many = joined(twos[f"order_spe{k}_2"])
        assert many == one, f"steps_per_execution={k}: the rows of some step differ"

    plain = joined(twos["order_noshuffle"])
    assert all(sum(e, []) == list(range(45)) for f in plain for e in f), plain

    free = joined(threes["order_unseeded"])
    orders = [sum(e, []) for f in free for e in f]
    assert all(sorted(o) == list(range(45)) for o in orders), "an epoch missed or repeated rows"
    assert all([len(s) for s in e] == [8] * 5 + [5] for f in free for e in f)
    for i in range(len(orders)):
        for j in range(i):
            assert orders[i] != orders[j], f"epochs {j} and {i} (of 2 fits x 3) saw one order"


@pytest.fixture(scope="module")
def different_data_job(tmp):
    """scripts/different_data.py "each": every mode below in one np=2 job, which goes on after
    each failure and writes MODE.RANK (the outcome) in its own folder."""
    folder = tmp / "different_data"
    folder.mkdir()
    script = os.path.join(SCRIPTS, "different_data.py")
    job = Job(
        mtxrun() + ["-np", "2", "--transparent", "python", script, "each"],
        cwd=str(folder),
        timeout=JOB_TIMEOUT,
    )
    job.check_ok()
    return folder, job


@pytest.mark.parametrize(
    "mode,argument,call",
    [
        ("fit_x", "x", "fit"),
        ("fit_y", "y", "fit"),
        ("fit_val", "validation_data", "fit"),
        ("evaluate", "x", "evaluate"),
        ("predict", "x", "predict"),
    ],
)
def test_transparent_ranks_given_different_arrays_fail_naming_them(
    different_data_job, mode, argument, call
):
    # A script that draws its data or split from an unseeded generator gives each rank other
    # arrays: each rank takes its own rows of its own data, and training (or predict) mixed them
    # silently. Every rank must fail at the call, naming the argument and the ranks
    # (scripts/different_data.py).
    folder, job = different_data_job
    message = "ValueError: mtxrun --transparent: the %s given to %s differ between the ranks: " % (
        argument,
        call,
    )
    for rank in (0, 1):
        outcome = (folder / ("%s.%d" % (mode, rank))).read_text()
        assert outcome.startswith(message + "rank(s) 1 hold"), (rank, outcome, job.describe())


def test_transparent_ranks_given_the_same_arrays_run_on(different_data_job):
    # ... after the failures above, in the same job: the same arrays everywhere run to the end.
    folder, job = different_data_job
    assert [(folder / ("same.%d" % r)).read_text() for r in (0, 1)] == ["done"] * 2, job.describe()


def test_transparent_different_arrays_end_a_job_that_does_not_catch_the_error(tmp_path):
    script = os.path.join(SCRIPTS, "different_data.py")
    job = Job(
        mtxrun() + ["-np", "2", "--transparent", "python", script, "fit_x"],
        cwd=str(tmp_path),
        timeout=JOB_TIMEOUT,
    )
    assert job.returncode != 0, job.describe()
    message = "the x given to fit differ between the ranks: rank(s) 1 hold"
    assert message in job.stderr, job.describe()
    assert not list(tmp_path.glob("done.*")), job.describe()
