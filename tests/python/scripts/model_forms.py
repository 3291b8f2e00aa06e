"""Plain Keras (no mtxcomm import), for models whose form the transparent mode must handle as
the 1-process run does. sys.argv[1]: the output JSON ("{rank}" replaced by
OMPI_COMM_WORLD_RANK, "{form}" by the form): weights (BatchNormalization's moving statistics
included), the History of fit() and predict() on held-out rows. sys.argv[2:], the forms, run one
after the other in this process (each from a fresh import of its module, after
keras.backend.clear_session(), as a script of its own would; one TensorFlow import serves them
all):
  dict_outputs   inputs {"a", "b"} and outputs {"cls", "reg"}, fit with dict targets
  dict_weights   the same with dict sample weights
  batch_norm     Dense -> BatchNormalization -> relu -> Dense; 97 rows in batches of 32 (every
                 batch splits unevenly over 3 ranks, the last one has a single row)
  fit_twice      fit on 50 rows, then on 64 other rows, then on those changed in place; then
                 save("m.keras") and keras.models.load_model (its predictions are recorded)
  ratio_metrics  a classifier with AUC, Precision, Recall and F1Score (per class, an array) and
                 a weighted metric with sample weights, in batches of 15 (uneven splits); then
                 train_on_batch and test_on_batch, whose returned values are recorded
  custom_step    a two-output model whose per-output losses Keras tracks, a subclassed model
                 whose train_step keeps its own Mean loss tracker, and one whose test_step
                 returns only its own tracker (validation and evaluate); batches of 25 and 15
  manual_update  a train_step that assigns the weights itself (no optimizer): the transparent
                 mode must fail on every rank, naming a variable
  checkpoints    steps_per_execution=2; ModelCheckpoint of the best model (.keras) and of the
                 last weights (.weights.h5), both loaded right after fit (the predictions of
                 the model, the loaded best model, a new model given the loaded weights and the
                 best model loaded uncompiled); model.export of a SavedModel
  loss_forms     a loss with reduction "sum" and a custom metric whose result() is its state
                 variable itself, in batches of 15 (uneven splits)
  stop_on_rank0  a callback that stops training at the end of epoch 2 on rank 0 only (a
                 budget that runs out there first): every rank must stop with it
  guide_steps    keras.io's custom train_step and test_step, which return
                 {m.name: m.result() for m in self.metrics} (the compiled metrics' result is a
                 dict of theirs), with AUC and accuracy, validation and evaluate
  state_forms    a loss with reduction "sum" with weight and activity regularizers; a layer
                 that keeps a moving mean of its inputs, a float count of its calls (assigned
                 inside a cond), an integer count of steps and a count of rows (aggregation
                 "sum") in non-trainable weights assigned in call; a train_step that slices x,
                 fit on
                 NumPy x alone (Keras hands the step x itself); 65 rows in batches of 16 (the
                 last batch has a single row)
  two_optimizers keras.io's GAN form: compile(d_optimizer, g_optimizer) keeps two optimizers
                 as attributes (the compiled one is unused) and train_step applies each to
                 its sub-model (the latent vectors come from the rows, so that the runs agree
                 draw for draw); 256 rows from tf.data in batches of 64
  save_reload    save_weights and save to paths that hold an earlier save, the other ranks
                 reaching the save 1 s after rank 0, then load_weights and load_model at once,
                 on a thread of its own after model.export, tf.saved_model.save and load, and a
                 LambdaCallback that saves and loads at each epoch's end, a ModelCheckpoint
                 given to fit and then to evaluate: the loaded models are the latest, and
                 reloading takes under 10 s"""

import importlib
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

FIT_FORMS = (
    "dict_outputs",
    "dict_weights",
    "fit_twice",
    "ratio_metrics",
    "custom_step",
    "manual_update",
    "checkpoints",
    "loss_forms",
)
STEP_FORMS = ("state_forms", "two_optimizers", "stop_on_rank0", "guide_steps", "save_reload")


def run_form(out, form):
    """Runs FORM as the script's module level did: sys.argv[1:3] = OUT, FORM, and the form's
    modules (_forms_setup: the seeds and the rows' generator) imported afresh."""
    sys.argv[1:] = [out, form]
    for name in ("_forms_setup", "_forms_fit", "_forms_steps"):
        sys.modules.pop(name, None)
    rng = importlib.import_module("_forms_setup").rng
    if form in FIT_FORMS or form in STEP_FORMS:
        m = importlib.import_module("_forms_fit" if form in FIT_FORMS else "_forms_steps")
        return m.history, m.model, m.predicted
    x = rng.normal(size=(147, 5)).astype("float32")
    y = (x @ rng.normal(size=(5, 1))).astype("float32")
    model = keras.Sequential(
        [
            keras.Input((5,)),
            keras.layers.Dense(6),
            keras.layers.BatchNormalization(),
            keras.layers.Activation("relu"),
            keras.layers.Dense(1),
        ]
    )
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    history = model.fit(x[:97], y[:97], batch_size=32, epochs=3, shuffle=False, verbose=0)
    return history, model, [model.predict(x[97:], batch_size=16, verbose=0).tolist()]


pattern, forms = sys.argv[1], sys.argv[2:]
if len(forms) > 1 and "{form}" not in pattern:
    raise SystemExit("model_forms.py: several forms need {form} in the output path")
for i, form in enumerate(forms):
    if i:
        keras.backend.clear_session()  # a fresh process's Keras state for the next form
    out = pattern.replace("{form}", form)
    history, model, predicted = run_form(out, form)
    with open(out.replace("{rank}", os.environ.get("OMPI_COMM_WORLD_RANK", "0")), "w") as f:
        json.dump(
            {
                "history": {
                    k: [np.asarray(v).tolist() for v in vs] for k, vs in history.history.items()
                },
                "predict": predicted,
                "weights": [w.tolist() for w in model.get_weights()],
            },
            f,
        )
