"""The one file of a multipart/form-data upload, found in a body already read within the byte limit.

Parsed here, not by a streaming reader, so that every limit is explicit and holds whatever the
body's shape: the parts looked at (`MAX_PARTS`), each part's header lines (`MAX_PART_HEADERS`)
and their length (`MAX_HEADER_LINE`), the boundary's length (RFC 2046: 1 to 70 characters).
A streaming reader also scans a preamble with no boundary for as long as the client sends it.
Nothing recurses: a part that is itself multipart is a part without a file, and is skipped.
"""

from __future__ import annotations

from email.message import Message

MAX_PARTS = 16  # a browser's form sends one file part, perhaps a few fields
MAX_PART_HEADERS = 16  # Content-Disposition and Content-Type, in practice
MAX_HEADER_LINE = 8190  # aiohttp's own limit on a request's header line
MAX_BOUNDARY = 70  # RFC 2046
MAX_HEAD_BYTES = MAX_PART_HEADERS * (MAX_HEADER_LINE + 2) + 4  # where its blank line is looked for
PLAIN_ENCODINGS = ("", "binary", "8bit", "7bit")


class MultipartRejected(ValueError):
    """A multipart body this server does not read: the message says why, in one line."""


def boundary_of(content_type: str) -> bytes:
    """The boundary parameter of a Content-Type header."""
    header = Message()
    header["Content-Type"] = content_type
    boundary = header.get_param("boundary")
    if not isinstance(boundary, str) or not 0 < len(boundary) <= MAX_BOUNDARY:
        raise MultipartRejected(f"Content-Type needs a boundary of 1 to {MAX_BOUNDARY} characters")
    try:
        return boundary.encode("ascii")
    except UnicodeEncodeError:
        raise MultipartRejected("the boundary must be ASCII") from None


def the_file(body: bytes, content_type: str) -> bytes:
    """The content of the one part that names a filename. A second file is refused, not dropped:
    the answer is one photo's, and the sender would not know which."""
    delimiter = b"\r\n--" + boundary_of(content_type)
    pieces = (b"\r\n" + body).split(delimiter, MAX_PARTS + 1)
    if len(pieces) < 2:
        raise MultipartRejected("no boundary line in the body")
    looked_at = pieces[1 : MAX_PARTS + 1]
    if not all(piece.startswith(b"--") or _delimiter_line_end(piece) >= 0 for piece in looked_at):
        raise MultipartRejected("a boundary line is followed by more than white space")
    files, closed = [], False
    for piece in looked_at:
        if piece.startswith(b"--"):  # the close delimiter
            closed = True
            break
        headers, content = _split_part(piece)
        if _plain_encoding(headers) and _filename(headers):
            files.append(content)
    if len(files) > 1:
        raise MultipartRejected("the upload holds more than one file: send one a request, or several as JSON instances")
    if files:
        return files[0]
    if closed:
        raise MultipartRejected("the upload holds no file")
    if len(pieces) > MAX_PARTS + 1:
        raise MultipartRejected(f"no file in the first {MAX_PARTS} parts")
    raise MultipartRejected("the body ends before its closing boundary")


def _split_part(piece: bytes) -> tuple[dict[str, str], bytes]:
    """A part's headers (names lower-cased) and content; the delimiter line's padding dropped."""
    line_end = _delimiter_line_end(piece)
    head_end = piece.find(b"\r\n\r\n", line_end, line_end + MAX_HEAD_BYTES)
    if head_end < 0:
        raise MultipartRejected(f"a part's headers are not ended by a blank line within {MAX_HEAD_BYTES} bytes")
    lines = piece[line_end + 2 : head_end].split(b"\r\n") if head_end > line_end else []
    if len(lines) > MAX_PART_HEADERS:
        raise MultipartRejected(f"a part has more than {MAX_PART_HEADERS} header lines")
    return dict(_header(line) for line in lines), piece[head_end + 4 :]


def _delimiter_line_end(piece: bytes) -> int:
    """Where the delimiter line's CRLF starts, or -1 if more than white space precedes it."""
    line_end = piece.find(b"\r\n", 0, MAX_HEADER_LINE)
    return line_end if line_end >= 0 and not piece[:line_end].strip(b" \t") else -1


def _header(line: bytes) -> tuple[str, str]:
    if len(line) > MAX_HEADER_LINE:
        raise MultipartRejected(f"a part's header line is longer than {MAX_HEADER_LINE} bytes")
    name, colon, value = line.partition(b":")
    text = value.decode("utf-8", "replace").strip()
    if not colon or not name.strip() or any(c < 32 and c != 9 for c in line):
        raise MultipartRejected("a part's header line is not 'Name: value'")
    return name.decode("latin-1").strip().lower(), text


def _plain_encoding(headers: dict[str, str]) -> bool:
    encoding = headers.get("content-transfer-encoding", "").lower()
    if encoding not in PLAIN_ENCODINGS or headers.get("content-encoding", "identity").lower() != "identity":
        raise MultipartRejected("a part's bytes are encoded; send the file as it is")
    return True


def _filename(headers: dict[str, str]) -> str:
    disposition = Message()
    disposition["Content-Disposition"] = headers.get("content-disposition", "")
    name = disposition.get_filename()
    return name if isinstance(name, str) else ""
