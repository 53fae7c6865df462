"""A multipart/form-data body read as it arrives: the file field's bytes go to a sink chunk by
chunk, the other fields are kept (each bounded), so no part of the body is ever held whole.

Fields may come in any order (the Node SDK sends ``file`` before ``purpose``, the Python SDK after
it), so the caller learns the text fields only once the body has ended."""

from collections.abc import Callable
from dataclasses import dataclass, field
from email.message import Message
from typing import Protocol

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser

from functions.core.errors import InvalidRequest

#: Bounds on what a client may send beside the file: a text field's bytes, the number of parts.
MAX_FIELD_BYTES = 64 * 1024
MAX_PARTS = 32
UNPARSABLE = "We could not parse the multipart/form-data body of your request"


class Sink(Protocol):
    def write(self, data: bytes) -> None: ...


@dataclass
class Form:
    """What the body carried: its text fields and, if there was one, the file's name and size."""

    fields: dict[str, str] = field(default_factory=dict)
    filename: str | None = None
    file_bytes: int = 0
    has_file: bool = False


def boundary_of(content_type: str | None) -> bytes:
    """The boundary of a ``multipart/form-data`` Content-Type, or InvalidRequest."""
    message = Message()
    message["Content-Type"] = content_type or ""
    if message.get_content_type() != "multipart/form-data":
        raise InvalidRequest(
            f"Unsupported Content-Type {(content_type or '')[:100]!r}: send the body as multipart/form-data.",
            code="unsupported_content_type",
        )
    boundary = message.get_param("boundary")
    if not isinstance(boundary, str) or not boundary:
        raise InvalidRequest(f"{UNPARSABLE}: its Content-Type header has no boundary.")
    return boundary.encode("latin-1", "replace")


class FormReader:
    """Feed it the body's chunks, then ``finish()``. The part named ``file_field`` is written to the
    sink ``open_file(filename)`` returns; the first one only (a second is an error)."""

    def __init__(self, content_type: str | None, file_field: str, open_file: Callable[[str | None], Sink]):
        self._file_field, self._open_file = file_field, open_file
        self.form = Form()
        self._parts = 0
        self._headers: list[tuple[bytes, bytes]] = []
        self._header_name = bytearray()
        self._header_value = bytearray()
        self._name: str | None = None
        self._value = bytearray()
        self._sink: Sink | None = None
        self._ended = False
        self._parser = MultipartParser(
            boundary_of(content_type),
            {
                "on_part_begin": self._part_begin,
                "on_header_field": lambda d, s, e: self._header_name.extend(d[s:e]),
                "on_header_value": lambda d, s, e: self._header_value.extend(d[s:e]),
                "on_header_end": self._header_end,
                "on_headers_finished": self._headers_finished,
                "on_part_data": self._part_data,
                "on_part_end": self._part_end,
                "on_end": self._end,
            },
        )

    def feed(self, chunk: bytes) -> None:
        try:
            self._parser.write(chunk)
        except MultipartParseError as exc:
            raise InvalidRequest(f"{UNPARSABLE}: {exc}.") from None

    def finish(self) -> Form:
        try:
            self._parser.finalize()
        except MultipartParseError as exc:
            raise InvalidRequest(f"{UNPARSABLE}: {exc}.") from None
        if not self._ended:
            raise InvalidRequest(f"{UNPARSABLE}: it ends before its closing boundary.")
        return self.form

    # --- parser callbacks ---------------------------------------------------------------------
    def _part_begin(self) -> None:
        self._parts += 1
        if self._parts > MAX_PARTS:
            raise InvalidRequest(f"{UNPARSABLE}: it has more than {MAX_PARTS} parts.")
        self._headers, self._name, self._sink = [], None, None
        self._value.clear()

    def _header_end(self) -> None:
        self._headers.append((bytes(self._header_name), bytes(self._header_value)))
        self._header_name.clear()
        self._header_value.clear()

    def _headers_finished(self) -> None:
        disposition = next((v for k, v in self._headers if k.lower() == b"content-disposition"), None)
        if disposition is None:
            raise InvalidRequest(f"{UNPARSABLE}: a part has no Content-Disposition header.")
        try:
            text = disposition.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidRequest(f"{UNPARSABLE}: its part headers are not valid UTF-8.") from None
        message = Message()
        message["Content-Disposition"] = text
        name = message.get_param("name", header="content-disposition")
        if not isinstance(name, str):
            raise InvalidRequest(f"{UNPARSABLE}: a part has no name.")
        self._name = name
        filename = message.get_param("filename", header="content-disposition")
        if self._name == self._file_field:
            if self.form.has_file:
                raise InvalidRequest(f"Only one '{self._file_field}' may be sent.", param=self._file_field)
            self.form.has_file = True
            self.form.filename = filename if isinstance(filename, str) else None
            self._sink = self._open_file(self.form.filename)

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        if self._sink is not None:
            self._sink.write(data[start:end])
            self.form.file_bytes += end - start
            return
        self._value.extend(data[start:end])
        if len(self._value) > MAX_FIELD_BYTES:
            raise InvalidRequest(f"The field {self._name!r} is over {MAX_FIELD_BYTES} bytes.", param=self._name)

    def _part_end(self) -> None:
        if self._sink is None and self._name is not None:
            try:
                self.form.fields[self._name] = self._value.decode("utf-8")
            except UnicodeDecodeError:
                raise InvalidRequest(f"The field {self._name!r} is not valid UTF-8.", param=self._name) from None
        self._sink = None

    def _end(self) -> None:
        self._ended = True
