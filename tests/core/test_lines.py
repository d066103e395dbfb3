"""core.lines.LineSplitter: lines from chunks, long lines in bounded pieces, nothing lost,
no secret cut in two."""

import pytest

from clusterctl.core.lines import MAX_LINE, LineSplitter


def split(chunks, **kwargs):
    out = []
    s = LineSplitter(out.append, **kwargs)
    for c in chunks:
        s.feed(c)
    s.flush()
    return out


def test_lines_across_chunks_crlf_utf8_and_a_last_line_without_newline():
    data = "één\r\ntwee\n\ndrie".encode()
    # every split point, the multi-byte characters included
    for cut in range(len(data) + 1):
        assert split([data[:cut], data[cut:]]) == ["één", "twee", "", "drie"], cut


def test_text_chunks_and_bytes_chunks_give_the_same_lines():
    assert split(["a\nb", "c\n"]) == split([b"a\nb", b"c\n"]) == ["a", "bc"]


@pytest.mark.parametrize("length", [MAX_LINE - 1, MAX_LINE, MAX_LINE + 1, 3 * MAX_LINE, 10 * MAX_LINE + 7])
def test_a_long_line_comes_in_pieces_of_at_most_max_line_and_nothing_is_lost(length):
    line = "".join(chr(ord("a") + i % 26) for i in range(length))
    out = split([line[i:i + 4096] for i in range(0, length, 4096)] + ["\nnext\n"])
    assert out[-1] == "next"
    pieces = out[:-1]
    assert "".join(pieces) == line
    assert all(0 < len(p) <= MAX_LINE for p in pieces)
    assert len(pieces) == -(-length // MAX_LINE)   # no empty piece after an exact multiple


def test_memory_is_bounded_while_megabytes_arrive_without_a_newline():
    """A progress bar redrawn with \\r for hours: what waits here stays under the bound."""
    seen, biggest = [], 0
    s = LineSplitter(seen.append)
    bar = ("\r[" + "#" * 60 + "] 99%").encode()
    for _ in range(40_000):      # ~2.7 MB, no newline
        s.feed(bar)
        biggest = max(biggest, s._size)
    assert biggest < MAX_LINE + len(bar)
    s.flush()
    assert "".join(seen) == (bar * 40_000).decode()


def test_the_pieces_after_the_first_go_to_on_continued():
    first, rest = [], []
    s = LineSplitter(first.append, on_continued=rest.append, max_line=10)
    s.feed("0: " + "x" * 25)
    s.feed("\n1: short\n")
    assert first == ["0: xxxxxxx", "1: short"]
    assert rest == ["x" * 10, "x" * 8]


@pytest.mark.parametrize("offset", range(-12, 3))
def test_a_cut_never_falls_inside_a_keep_whole_string(offset):
    """The secret sits across the natural cut point (max_line) at every offset; fed in small
    chunks so that the splitter must wait to see the secret's end before it cuts."""
    secret = "s3cr3t-VALUE"
    n = 64
    line = "a" * (n + offset) + secret + "b" * 100
    chunks = [line[i:i + 5] for i in range(0, len(line), 5)]
    out = split(chunks + ["\n"], max_line=n, keep_whole=[secret])
    assert "".join(out) == line
    assert sum(p.count(secret) for p in out) == 1
    assert all(len(p) <= n for p in out)
    # without keep_whole the cut does split it at some offsets: the test can fail
    if 0 < n - (n + offset) % n < len(secret) and offset < 0:
        plain = split(chunks + ["\n"], max_line=n)
        assert sum(p.count(secret) for p in plain) == 0
