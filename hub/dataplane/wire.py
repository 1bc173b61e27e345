"""Data-plane frame layouts, shared by the server, the reader and every transport.

    request  = "RLSD" | u8 proto=1 | u8 transport kind | u16 0 | u32 body_len | msgpack body
    per unit = u32 unit | u8 status (0 ok, 1 error) | u64 payload_len | payload
An error frame's payload is msgpack [code, message]; unit 0xFFFFFFFF means the whole request.
"""
import struct

REQ = struct.Struct("!4sBBHI")
UNIT = struct.Struct("!IBQ")
MAGIC = b"RLSD"
OK, ERR = 0, 1
WHOLE = 0xFFFFFFFF
MAX_REQUEST_BYTES = 1 << 20
