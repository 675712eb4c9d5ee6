"""files/regular.py: a reader opens only plain files, never waiting on a FIFO or reading a device
for ever."""

from __future__ import annotations

import os

import pytest

from edgerl.files.regular import (
    FileTooLargeError,
    NotRegularFileError,
    open_regular,
    read_regular,
)


def test_a_plain_file_reads_whole_or_up_to_its_limit(tmp_path):
    f = tmp_path / "f"
    f.write_bytes(b"12345")
    assert read_regular(f) == b"12345" and read_regular(f, 5) == b"12345"
    with pytest.raises(FileTooLargeError, match="larger than 4 bytes"):
        read_regular(f, 4)
    with open_regular(f) as opened:
        assert opened.read() == b"12345"
    link = tmp_path / "link"
    link.symlink_to(f)  # a link to a plain file is one
    assert read_regular(link) == b"12345"


def test_a_fifo_is_refused_at_once(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # no writer: a blocking open would wait for ever
    with pytest.raises(NotRegularFileError) as caught:
        read_regular(fifo)
    assert caught.value.strerror == "it is a FIFO, not a file"


def test_a_device_a_directory_and_nothing_are_each_named(tmp_path):
    zero = tmp_path / "zero"
    zero.symlink_to("/dev/zero")  # endless bytes
    with pytest.raises(NotRegularFileError, match="a character device"):
        read_regular(zero)
    with pytest.raises(IsADirectoryError, match="a directory"):
        read_regular(tmp_path)
    with pytest.raises(FileNotFoundError):
        read_regular(tmp_path / "missing")
