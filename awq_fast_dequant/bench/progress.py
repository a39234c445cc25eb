"""Progress on stderr: a tqdm bar when tqdm is installed, else one plain line
per step (a stage of a shape), so that a run shows what it is doing from its
first second whatever is installed. Messages (`write`) always go to stderr."""

from __future__ import annotations

import sys
import time


class Silent:
    """--no-progress: no bar and no step lines; messages still reach stderr."""

    def __init__(self):
        self.done = 0
        self.total = None

    def set_total(self, total: int) -> None:
        self.total = total

    def update(self, n: int = 1) -> None:
        self.done += n

    def set_description_str(self, text: str) -> None:
        pass

    def write(self, text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        pass


class Lines(Silent):
    """One line per step: "[done/total] what", and a line at least every
    `every` seconds inside a long step, so that a slow stage still shows life."""

    def __init__(self, every: float = 10.0):
        super().__init__()
        self.every = every
        self.text = ""
        self.last = time.monotonic()

    def _line(self) -> None:
        total = "?" if self.total is None else str(self.total)
        print(f"bench [{self.done:>{len(total)}}/{total}] {self.text}", file=sys.stderr, flush=True)
        self.last = time.monotonic()

    def update(self, n: int = 1) -> None:
        super().update(n)
        if time.monotonic() - self.last >= self.every:
            self._line()

    def set_description_str(self, text: str) -> None:
        if text != self.text:
            self.text = text
            self._line()

    def close(self) -> None:
        if self.text != "done":
            self.text = "done"
            self._line()


class Bar(Silent):
    """A tqdm bar; the total is set once the run knows its steps."""

    def __init__(self, tqdm):
        super().__init__()
        self.tqdm = tqdm
        self.bar = tqdm(total=None, unit="step", dynamic_ncols=True, file=sys.stderr)

    def set_total(self, total: int) -> None:
        super().set_total(total)
        self.bar.total = total
        self.bar.refresh()

    def update(self, n: int = 1) -> None:
        super().update(n)
        self.bar.update(n)

    def set_description_str(self, text: str) -> None:
        self.bar.set_description_str(text)

    def write(self, text: str) -> None:
        self.tqdm.write(text, file=sys.stderr)

    def close(self) -> None:
        self.bar.close()


def make_progress(enabled: bool) -> Silent:
    """A tqdm bar, plain lines without tqdm, or nothing when not enabled."""
    if not enabled:
        return Silent()
    try:
        from tqdm import tqdm
    except ImportError:
        return Lines()
    return Bar(tqdm)
