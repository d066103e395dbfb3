"""Turn a stream of output into lines, with a bound on how much one line may hold.

One job: ``LineSplitter`` takes chunks (bytes, decoded as UTF-8 with replacement, or text)
and hands complete lines, without their newline, to a callback.  A line longer than
``MAX_LINE`` characters is handed on in pieces of at most ``MAX_LINE`` characters as it
arrives, the way Docker's log drivers split a long line into 16 KiB partial messages: a rank
that writes megabytes without a newline (a progress bar redrawn with ``\\r`` for hours, a
dumped tensor) costs bounded memory and linear time here, and no character is lost.  A cut
never falls inside one of the ``keep_whole`` strings (a run's secret values, which the log
sink masks line by line: half a secret in each of two pieces would be masked in neither).
Pure.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Iterable

#: Most characters one line may hold before it is passed on in pieces (a log line, not a file).
MAX_LINE = 64 * 1024


class LineSplitter:
    """Complete lines from chunks of bytes or text, for a callback (see the module docstring).

    ``feed(chunk)`` for each chunk as it comes, ``flush()`` at the end of the stream (the last
    line may have no newline).  A trailing ``\\r`` (a CRLF line end) is dropped.  Memory: the
    unfinished line, under ``max_line`` characters plus the longest ``keep_whole`` string
    plus one chunk.  ``on_continued``, when given, gets the pieces of a cut line after its
    first (a reader that labels lines by their first characters, such as srun's ``--label``,
    knows whose they are); otherwise ``on_line`` does."""

    def __init__(self, on_line: Callable[[str], None], *, max_line: int = MAX_LINE,
                 on_continued: Callable[[str], None] | None = None,
                 keep_whole: Iterable[str] = ()) -> None:
        self.on_line = on_line
        self.on_continued = on_continued or on_line
        self.max_line = max_line
        self.keep_whole = tuple(s for s in keep_whole if len(s) > 1)
        self._lookahead = max((len(s) - 1 for s in self.keep_whole), default=0)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._parts: list[str] = []   # the unfinished line, in the pieces it came in
        self._size = 0
        self._cut = False             # a piece of the unfinished line was passed on already

    def feed(self, chunk: bytes | str) -> None:
        text = self._decoder.decode(chunk) if isinstance(chunk, bytes | bytearray) else chunk
        if not text:
            return
        *complete, rest = text.split("\n")
        if complete:
            self._parts.append(complete[0])
            first = "".join(self._parts)
            self._parts, self._size = [], 0
            self._emit(first)
            for line in complete[1:]:
                self._emit(line)
        if rest:
            self._parts.append(rest)
            self._size += len(rest)
            if self._size >= self.max_line + self._lookahead:
                self._pass_on_full_pieces()

    def flush(self) -> None:
        """The end of the stream: hand on the last line, if it has no newline."""
        tail = self._decoder.decode(b"", final=True)
        if tail:
            self._parts.append(tail)
        last = "".join(self._parts)
        self._parts, self._size = [], 0
        if last:
            self._emit(last)
        self._cut = False

    def _emit(self, line: str) -> None:
        """The end of a line: its (last) pieces; the next line starts afresh."""
        line = line.removesuffix("\r")
        start = 0
        while len(line) - start > self.max_line:
            end = self._cut_at(line, start)
            self._piece(line[start:end])
            start = end
        if start < len(line) or not self._cut:   # not the empty end of a cut line
            self._piece(line[start:])
        self._cut = False

    def _pass_on_full_pieces(self) -> None:
        """The unfinished line is over the bound: pass on the pieces whose ends are known to
        cut no ``keep_whole`` string (the text after each cut is here to look at)."""
        pending = "".join(self._parts)
        start = 0
        while len(pending) - start >= self.max_line + self._lookahead:
            end = self._cut_at(pending, start)
            self._piece(pending[start:end])
            start = end
        rest = pending[start:]
        self._parts, self._size = ([rest], len(rest)) if rest else ([], 0)

    def _cut_at(self, text: str, start: int) -> int:
        """Where the piece from ``start`` ends: ``max_line`` characters on, or earlier, at the
        start of a ``keep_whole`` string that would be cut there."""
        end = start + self.max_line
        moved = True
        while moved:
            moved = False
            for s in self.keep_whole:
                i = text.find(s, max(start + 1, end - len(s) + 1), end + len(s) - 1)
                if start < i < end:
                    end, moved = i, True
        return end

    def _piece(self, text: str) -> None:
        (self.on_continued if self._cut else self.on_line)(text)
        self._cut = True
