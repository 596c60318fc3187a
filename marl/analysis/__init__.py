"""The measures: what a run's records say, during training and after it.

Emergent-communication metrics and listening tests (``emergence``, ``listening``,
``listening_log``), the held-out evaluation's paired comparison (``evaluation``), rollout
metrics, TensorBoard logging and hyperparameters (``metrics``, ``tensorboard``, ``hparams``),
the run summary and ``marl report`` (``summary``, ``report``), and the statistics they share
(``stats``). It reads the records and the runtime below it; the competition and the loop read
it (tests/test_layering.py).
"""
