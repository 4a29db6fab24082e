"""Reading parallel text: line handling, every input error, and the length filter."""

import gzip

import pytest

from transduce.data.text import DataError, FilterReport, filter_reason, read_lines, read_parallel


def write(path, data: bytes, gz=False):
    if gz:
        with gzip.open(path, "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)
    return path


@pytest.mark.parametrize("gz", [False, True])
def test_read_lines_plain_and_gzip(tmp_path, gz):
    p = write(tmp_path / ("a.txt.gz" if gz else "a.txt"), "eins\nzwei drei\r\n\nvier".encode(), gz)
    assert list(read_lines(p)) == ["eins", "zwei drei", "", "vier"]


def test_gzip_is_detected_by_content_not_name(tmp_path):
    p = write(tmp_path / "looks_plain.txt", b"a\nb\n", gz=True)
    assert list(read_lines(p)) == ["a", "b"]


def test_lines_split_on_newline_only(tmp_path):
    # U+2028, U+0085 and a lone \r inside a sentence must not create new lines
    p = write(tmp_path / "a.txt", "x\u2028y\nz\x85w\nu\rv\n".encode())
    assert list(read_lines(p)) == ["x\u2028y", "z\x85w", "u\rv"]


def test_byte_order_mark_is_removed(tmp_path):
    p = write(tmp_path / "a.txt", "\ufeffHallo\nWelt\n".encode())
    assert list(read_lines(p)) == ["Hallo", "Welt"]


def test_missing_file(tmp_path):
    with pytest.raises(DataError) as e:
        list(read_lines(tmp_path / "nope.en"))
    assert str(e.value) == f"{tmp_path / 'nope.en'}: no such file"


@pytest.mark.parametrize("gz", [False, True])
def test_empty_file(tmp_path, gz):
    p = write(tmp_path / "empty.de", b"", gz)
    with pytest.raises(DataError) as e:
        list(read_lines(p))
    assert str(e.value) == f"{p}: empty file (no lines)"


@pytest.mark.parametrize("gz", [False, True])
def test_invalid_utf8_names_file_and_line(tmp_path, gz):
    p = write(tmp_path / "bad.de", b"gut\nauch gut\nschlecht \xff\xfe hier\nnie gelesen\n", gz)
    lines = read_lines(p)
    assert next(lines) == "gut"  # streaming: the error comes when line 3 is reached
    with pytest.raises(DataError) as e:
        list(lines)
    assert str(e.value) == f"{p}:3: invalid UTF-8 (byte 10 of the line)"  # "schlecht " is bytes 1-9
    assert e.value.path == str(p) and e.value.line == 3
    assert "\n" not in str(e.value)


def test_corrupt_gzip(tmp_path):
    data = gzip.compress(b"line\n" * 1000)
    p = write(tmp_path / "cut.gz", data[: len(data) // 2])
    with pytest.raises(DataError) as e:
        list(read_lines(p))
    assert str(e.value).startswith(f"{p}:") and "corrupt gzip" in str(e.value)


def test_directory_is_not_a_file(tmp_path):
    with pytest.raises(DataError, match="is a directory"):
        list(read_lines(tmp_path))


def test_read_parallel(tmp_path):
    src = write(tmp_path / "a.en", b"one\ntwo\n")
    tgt = write(tmp_path / "a.de", b"eins\nzwei\n", gz=True)
    assert list(read_parallel(src, tgt)) == [("one", "eins"), ("two", "zwei")]


def test_line_count_mismatch_target_longer(tmp_path):
    src = write(tmp_path / "a.en", b"one\ntwo\n")
    tgt = write(tmp_path / "a.de", b"eins\nzwei\ndrei\nvier\n")
    with pytest.raises(DataError) as e:
        list(read_parallel(src, tgt))
    assert str(e.value) == f"{tgt}:3: {src} has only 2 lines (line counts differ)"


def test_line_count_mismatch_source_longer(tmp_path):
    src = write(tmp_path / "a.en", b"one\ntwo\nthree\n")
    tgt = write(tmp_path / "a.de", b"eins\n")
    with pytest.raises(DataError) as e:
        list(read_parallel(src, tgt))
    assert str(e.value) == f"{src}:2: {tgt} has only 1 lines (line counts differ)"


def test_filter_reason():
    assert filter_reason(5, 7, max_len=10, max_ratio=9) is None
    assert filter_reason(0, 7, 10, 9) == "empty"
    assert filter_reason(3, 0, 10, 9) == "empty"
    assert filter_reason(11, 7, 10, 9) == "too_long"
    assert filter_reason(3, 11, 10, 9) == "too_long"
    assert filter_reason(1, 9, 100, 9) is None  # ratio exactly 9 is kept
    assert filter_reason(1, 10, 100, 9) == "bad_ratio"
    assert filter_reason(20, 2, 100, 9) == "bad_ratio"


def test_filter_report_counts_every_pair():
    r = FilterReport(max_len=10, max_ratio=3)
    for line, (s, t) in enumerate([(4, 5), (0, 3), (12, 2), (1, 4), (2, 2), (0, 0)], start=1):
        r.count(filter_reason(s, t, r.max_len, r.max_ratio), line)
    assert (r.read, r.kept, r.empty, r.too_long, r.bad_ratio, r.dropped) == (6, 2, 2, 1, 1, 4)
    assert r.examples == {"empty": [2, 6], "too_long": [3], "bad_ratio": [4]}
    assert r.summary() == "6 pairs read, 2 kept; dropped: 2 empty, 1 longer than 10 tokens, 1 with length ratio > 3"
    assert r.to_dict()["kept"] == 2


def test_data_error_is_one_line():
    e = DataError("two\nlines", "f.txt", 7)
    assert str(e) == "f.txt:7: two lines"
    assert str(DataError("plain")) == "plain"
