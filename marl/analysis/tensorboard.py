"""TensorBoard logging: scalars, transcripts as text, the config once, and the run's HParams
session (its hparams and final metrics, :mod:`marl.analysis.hparams`) in the same event files,
so one run of training is one run in TensorBoard."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from torch.utils.tensorboard import SummaryWriter


class TensorBoardLogger:
    """A thin, namespaced wrapper over ``SummaryWriter`` that can be switched off.

    ``purge_step``: a run continuing this folder from a checkpoint passes the step after it;
    TensorBoard's reader then drops what earlier writers logged at that step or later (a
    crashed tail), so every step shows once.
    """

    def __init__(
        self, log_dir: str | Path, enabled: bool = True, purge_step: int | None = None
    ) -> None:
        self.log_dir = Path(log_dir)
        self.writer = SummaryWriter(str(self.log_dir), purge_step=purge_step) if enabled else None
        self.session_open = False

    def scalars(self, values: dict[str, float], step: int) -> None:
        """Log every scalar under its (already namespaced) tag."""
        if self.writer is None:
            return
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)

    def text(self, tag: str, text: str, step: int) -> None:
        """Log text; TensorBoard renders it as markdown, so it goes in a code block."""
        if self.writer is not None:
            self.writer.add_text(tag, "```\n" + text + "\n```", step)

    def heatmap(self, tag: str, labels: list[str], matrix: list[list[float]], step: int) -> None:
        """Log a labelled matrix (rows affect columns) as an image."""
        if self.writer is None:
            return
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        size = 1.2 + 0.6 * len(labels)
        figure, axes = plt.subplots(figsize=(size, size))
        image = axes.imshow(matrix, cmap="coolwarm")
        axes.set_xticks(range(len(labels)), labels, rotation=45, ha="right")
        axes.set_yticks(range(len(labels)), labels)
        axes.set_xlabel("affected agent (return)")
        axes.set_ylabel("agent whose message changed")
        for i, row in enumerate(matrix):
            for j, value in enumerate(row):
                axes.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=8)
        figure.colorbar(image, ax=axes)
        figure.tight_layout()
        self.writer.add_figure(tag, figure, step)
        plt.close(figure)

    def start_session(
        self, hparams: Mapping[str, bool | int | float | str], trial: str | None = None
    ) -> None:
        """Open the run's HParams session with its hparams, in the run's own event files (not a
        subdirectory, which TensorBoard would list as a second run); ``trial`` names its row in
        the HParams tab."""
        if self.writer is None:
            return
        from marl.analysis.hparams import session_start

        self.writer._get_file_writer().add_summary(session_start(hparams, trial))
        self.writer.flush()  # a live run shows in the HParams tab (as running) at once
        self.session_open = True

    def end_session(self, finals: Mapping[str, float], step: int, status: str) -> None:
        """Log the final metrics (``final/<tag>``) at ``step`` and close the HParams session
        with ``status`` (``success`` or ``failure``)."""
        if self.writer is None or not self.session_open:
            return
        from marl.analysis.hparams import session_end

        for tag, value in finals.items():
            self.writer.add_scalar(tag, value, step)
        self.writer._get_file_writer().add_summary(session_end(status), step)
        self.writer.flush()
        self.session_open = False

    def close(self) -> None:
        """Flush and close the event files."""
        if self.writer is not None:
            self.writer.flush()
            self.writer.close()
