"""The recording file's format, writer and reader: now `loadertop.recfile` (the probe's black box
writes the same format and may not import this package); re-exported here for the viewer side."""

from loadertop.recfile import (
    FLUSH_S,
    FORMAT_VERSION,
    MAGIC,
    MAX_ENDPOINTS,
    MAX_HEADER_BYTES,
    MAX_RECORD_BYTES,
    EndEntry,
    EndpointEntry,
    Entry,
    Frame,
    FrameEntry,
    Header,
    Recording,
    RecordingError,
    RecordingWriter,
    default_name,
    iter_frames,
    read,
)

__all__ = ["FLUSH_S", "FORMAT_VERSION", "MAGIC", "MAX_ENDPOINTS", "MAX_HEADER_BYTES", "MAX_RECORD_BYTES",
           "EndEntry", "EndpointEntry", "Entry", "Frame", "FrameEntry", "Header", "Recording",
           "RecordingError", "RecordingWriter", "default_name", "iter_frames", "read"]
