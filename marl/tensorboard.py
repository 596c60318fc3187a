"""TensorBoard logging: scalars, transcripts as text, the config once."""

from __future__ import annotations

from pathlib import Path

from torch.utils.tensorboard import SummaryWriter


class TensorBoardLogger:
    """A thin, namespaced wrapper over ``SummaryWriter`` that can be switched off."""

    def __init__(self, log_dir: str | Path, enabled: bool = True) -> None:
        self.log_dir = Path(log_dir)
        self.writer = SummaryWriter(str(self.log_dir)) if enabled else None

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

    def close(self) -> None:
        """Flush and close the event file."""
        if self.writer is not None:
            self.writer.flush()
            self.writer.close()
