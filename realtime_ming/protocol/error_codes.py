"""The error codes of the Realtime event layer (`docs/protocol.md` §6).

`ErrorCode` is the only source of `error.code` strings the server sends; every entry fixes its error type and
message template. Codes are API: add freely, never rename or reuse. `protocol/errors.py` raises them
(`ProtocolError`).
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["ErrorCode", "ErrorType"]


class ErrorType(StrEnum):
    """The `error.type` values of `docs/protocol.md` §6."""

    INVALID_REQUEST = "invalid_request_error"
    SERVER = "server_error"


_INVALID = ErrorType.INVALID_REQUEST
_SERVER = ErrorType.SERVER


class ErrorCode(StrEnum):
    """Stable error codes; each member carries `error_type` and a `str.format` message template."""

    error_type: ErrorType
    template: str

    def __new__(cls, value: str, error_type: ErrorType, template: str) -> ErrorCode:
        member = str.__new__(cls, value)
        member._value_ = value
        member.error_type = error_type
        member.template = template
        return member

    # Framing and event shape (produced by `codec.parse`).
    INVALID_JSON = ("invalid_json", _INVALID, "The frame is not valid JSON: {detail}.")
    INVALID_EVENT = ("invalid_event", _INVALID, "Invalid event: {detail}.")
    INVALID_VALUE = ("invalid_value", _INVALID, "Invalid value for '{param}': {detail}.")
    UNKNOWN_PARAMETER = (
        "unknown_parameter",
        _INVALID,
        "Unknown parameter: '{param}'{hint}. Nothing of the event was applied.",
    )
    UNKNOWN_EVENT = ("unknown_event", _INVALID, "Unknown event type '{event_type}'.")
    UNSUPPORTED_EVENT = (
        "unsupported_event",
        _INVALID,
        "Event type '{event_type}' is not supported by this server.",
    )
    BINARY_FRAME_UNSUPPORTED = (
        "binary_frame_unsupported",
        _INVALID,
        "Binary frames are not supported; send events as JSON text frames.",
    )
    FRAME_TOO_LARGE = (
        "frame_too_large",
        _INVALID,
        "The frame of {num_bytes} bytes exceeds the limit of {max_bytes} bytes.",
    )
    EVENT_FRAME_TOO_LARGE = (
        "event_frame_too_large",
        _INVALID,
        "The {event_type} frame of {num_bytes} bytes exceeds the limit of {max_bytes} bytes for an event that carries"
        " no media (only {media_types} with audio, image or video data may take up to the frame limit).",
    )
    EVENT_TOO_LARGE = (
        "event_too_large",
        _SERVER,
        "The {event_type} event of {num_bytes} bytes was not sent: the WebRTC data channel carries messages of at"
        " most {max_bytes} bytes (the peer's max-message-size).",
    )
    # Bounds on every decoded value (`protocol.limits`), checked before any field is read.
    INVALID_TEXT = ("invalid_text", _INVALID, "Invalid text: {detail}.")
    NESTING_TOO_DEEP = (
        "nesting_too_deep",
        _INVALID,
        "The frame nests JSON arrays/objects deeper than {max_depth} levels{where}.",
    )
    INVALID_NUMBER = ("invalid_number", _INVALID, "Invalid number at '{param}': {detail}.")
    STRING_ABOVE_MAX_LENGTH = (
        "string_above_max_length",
        _INVALID,
        "'{param}' is too long: {length} characters, the limit is {max_length}.",
    )
    ARRAY_ABOVE_MAX_LENGTH = (
        "array_above_max_length",
        _INVALID,
        "'{param}' has too many entries: {length}, the limit is {max_length}.",
    )
    OBJECT_ABOVE_MAX_PROPERTIES = (
        "object_above_max_properties",
        _INVALID,
        "'{param}' has too many keys: {length}, the limit is {max_length}.",
    )
    TOOLS_TOO_LARGE = (
        "tools_too_large",
        _INVALID,
        "'{param}' is over the limit of {max_bytes} bytes of JSON for all tools together (the first tools alone"
        " take {num_bytes}).",
    )
    JSON_VALUE_TOO_LARGE = (
        "json_value_too_large",
        _INVALID,
        "'{param}' is {num_bytes} bytes of JSON, the limit is {max_bytes} bytes.",
    )
    # Session configuration.
    UNSUPPORTED_SESSION_TYPE = (
        "unsupported_session_type",
        _INVALID,
        "Unsupported session type '{session_type}'; this server runs 'realtime' and 'transcription' sessions.",
    )
    REALTIME_ONLY_PARAMETER = (
        "realtime_only_parameter",
        _INVALID,
        "'{param}' applies to realtime sessions only; a transcription session takes audio.input"
        " (format, transcription, noise_reduction, turn_detection) and include.",
    )
    TRANSCRIPTION_SESSION_NO_RESPONSE = (
        "transcription_session_no_response",
        _INVALID,
        "This is a transcription session: it transcribes committed audio and never creates responses"
        " (switch it to session.type 'realtime' for replies).",
    )
    SESSION_TYPE_CHANGE_WHILE_RESPONDING = (
        "session_type_change_while_responding",
        _INVALID,
        "The session type cannot change while a response is in progress; cancel it or wait for response.done.",
    )
    UNSUPPORTED_TRANSCRIPTION_MODEL = (
        "unsupported_transcription_model",
        _INVALID,
        "Unsupported transcription model '{model}': {reason}. Input audio is transcribed by the served model's own"
        " ASR; accepted names: {supported}.",
    )
    INVALID_SPEECH_STYLE = (
        "invalid_speech_style",
        _INVALID,
        "Invalid speech style at '{param}': {detail}.",
    )
    UNSUPPORTED_AUDIO_FORMAT = (
        "unsupported_audio_format",
        _INVALID,
        "Unsupported audio format '{audio_format}'; supported formats: {supported}.",
    )
    UNSUPPORTED_SAMPLE_RATE = (
        "unsupported_sample_rate",
        _INVALID,
        "Unsupported sample rate {rate} Hz for audio/pcm; supported rates: {supported}.",
    )
    UNSUPPORTED_TURN_DETECTION = (
        "unsupported_turn_detection",
        _INVALID,
        "Unsupported turn detection type '{kind}'; supported types: {supported}.",
    )
    UNSUPPORTED_NOISE_REDUCTION = (
        "unsupported_noise_reduction",
        _INVALID,
        "Input noise reduction '{kind}' is not available on this server ({detail}); set noise_reduction to null.",
    )
    UNKNOWN_VOICE = ("unknown_voice", _INVALID, "Unknown voice '{voice}'; available voices: {voices}.")
    VOICE_NOT_FOUND = (
        "voice_not_found",
        _INVALID,
        "Custom voice '{voice}' was not found for this API key: register it with POST /v1/realtime/voices "
        "(voices are per API key and the least recently used are evicted).",
    )
    UNSUPPORTED_PARAMETER = (
        "unsupported_parameter",
        _INVALID,
        "'{param}' is not supported by this server: {detail}.",
    )
    CANNOT_UPDATE_TRACING = (
        "cannot_update_tracing",
        _INVALID,
        "Tracing cannot be changed once it is enabled for a session.",
    )
    TOO_MANY_OUT_OF_BAND_RESPONSES = (
        "too_many_out_of_band_responses",
        _INVALID,
        "{active} out-of-band responses are already in progress (the limit is {limit}); wait for one to finish.",
    )
    # Settings measured in tokens where they are accepted (`session/prompt_limits.py`): refused there, never left
    # to fail every turn.
    INSTRUCTIONS_EXCEED_CONTEXT = (
        "instructions_exceed_context",
        _INVALID,
        "The instructions and tools take {num_tokens} tokens of the model's {max_seq_len}-token context; with"
        " {reply_tokens} tokens kept for the reply (max_output_tokens) the conversation would have {room} tokens"
        " left, less than the {min_tokens} it needs. Shorten '{param}' or lower max_output_tokens.",
    )
    SPEECH_STYLE_TOO_LONG = (
        "speech_style_too_long",
        _INVALID,
        "The speech style at '{param}' makes a talker caption of {num_tokens} talker tokens; the talker takes at"
        " most {max_tokens} (engine.talker.max_prompt_len). Shorten the style.",
    )
    TOKEN_LIMIT_TOO_SMALL = (
        "token_limit_too_small",
        _INVALID,
        "'{param}' is {value} tokens, less than the {min_tokens} tokens a conversation needs after the"
        " instructions: every response would fail.",
    )
    CANNOT_UPDATE_VOICE = (
        "cannot_update_voice",
        _INVALID,
        "The voice cannot be changed after the model has responded with audio.",
    )
    # Audio input buffer.
    INVALID_AUDIO = ("invalid_audio", _INVALID, "Invalid audio: {detail}.")
    INPUT_AUDIO_BUFFER_COMMIT_EMPTY = (
        "input_audio_buffer_commit_empty",
        _INVALID,
        "Error committing input audio buffer: buffer too small. Expected at least {min_ms}ms"
        " of audio, but buffer only has {buffered_ms:.2f}ms of audio.",
    )
    INPUT_AUDIO_BUFFER_TOO_LARGE = (
        "input_audio_buffer_too_large",
        _INVALID,
        "The input audio buffer holds more than {max_s} s of audio; commit or clear it.",
    )
    # Conversation items.
    INVALID_IMAGE = ("invalid_image", _INVALID, "Invalid image: {detail}.")
    IMAGE_TOO_LARGE = (
        "image_too_large",
        _INVALID,
        "The image of {width}x{height} pixels exceeds the limit of {max_pixels} pixels.",
    )
    IMAGE_TOO_SMALL = (
        "image_too_small",
        _INVALID,
        "The image of {width}x{height} pixels is smaller than {min_side} pixels on a side.",
    )
    IMAGE_ASPECT_RATIO_TOO_LARGE = (
        "image_aspect_ratio_too_large",
        _INVALID,
        "The image of {width}x{height} pixels has an aspect ratio above {max_ratio}.",
    )
    IMAGE_RATE_LIMITED = (
        "image_rate_limited",
        _INVALID,
        "Image rate limit: this session takes {rate:g} images per second in bursts of up to {burst}, and the"
        " event's {images} image(s) {detail}. Nothing of the event was applied.",
    )
    INVALID_VIDEO = ("invalid_video", _INVALID, "Invalid video: {detail}.")
    VIDEO_TOO_LONG = (
        "video_too_long",
        _INVALID,
        "The video of {duration_s:.1f} s exceeds the limit of {max_s:g} s per item.",
    )
    VIDEO_RATE_LIMITED = (
        "video_rate_limited",
        _INVALID,
        "Video rate limit: this session takes {rate:g} s of video per second in bursts of up to {burst:g} s, and"
        " the event's {clips} clip(s) of {seconds:.2f} s {detail}. Nothing of the event was applied.",
    )
    VIDEO_DECODER_UNAVAILABLE = (
        "video_decoder_unavailable",
        _INVALID,
        "This server cannot decode video containers (install the 'video' extra: PyAV); send the clip as"
        " 'frames' (image data URLs with timestamps) instead.",
    )
    INPUT_AUDIO_TOO_SHORT = (
        "input_audio_too_short",
        _INVALID,
        "The audio of {duration_ms:.2f} ms is too short; at least {min_ms:g} ms are needed.",
    )
    INPUT_AUDIO_TOO_LONG = (
        "input_audio_too_long",
        _INVALID,
        "The audio of {duration_s:.1f} s exceeds the limit of {max_s:g} s per item.",
    )
    INPUT_TEXT_TOO_LONG = (
        "input_text_too_long",
        _INVALID,
        "The text of {num_chars} characters exceeds the limit of {max_chars} characters per item.",
    )
    ITEM_TOO_LARGE = (
        "item_too_large",
        _INVALID,
        "The item holds {num_bytes} bytes, more than the session's conversation budget of {max_bytes} bytes.",
    )
    UNSUPPORTED_CONTENT = (
        "unsupported_content",
        _INVALID,
        "Content of type '{content_type}' cannot be created in a {role} message.",
    )
    ITEM_RETRIEVE_INVALID_ITEM_ID = (
        "item_retrieve_invalid_item_id",
        _INVALID,
        "Item with item_id '{item_id}' not found.",
    )
    ITEM_DELETE_INVALID_ITEM_ID = (
        "item_delete_invalid_item_id",
        _INVALID,
        "Item with item_id '{item_id}' not found.",
    )
    ITEM_TRUNCATE_INVALID_ITEM_ID = (
        "item_truncate_invalid_item_id",
        _INVALID,
        "Item with item_id '{item_id}' not found.",
    )
    ITEM_CREATE_INVALID_PREVIOUS_ITEM_ID = (
        "item_create_invalid_previous_item_id",
        _INVALID,
        "Previous item with item_id '{item_id}' not found.",
    )
    DUPLICATE_ITEM_ID = ("duplicate_item_id", _INVALID, "Item with item_id '{item_id}' already exists.")
    TRUNCATE_CONTENT_INDEX_INVALID = (
        "truncate_content_index_invalid",
        _INVALID,
        "Item '{item_id}' has no audio content at content_index {content_index}.",
    )
    TRUNCATE_AUDIO_END_MS_INVALID = (
        "truncate_audio_end_ms_invalid",
        _INVALID,
        "audio_end_ms {audio_end_ms} exceeds the {duration_ms} ms of audio in item '{item_id}'.",
    )
    EVENT_OUT_OF_ORDER = ("event_out_of_order", _INVALID, "'{event_type}' cannot be applied now: {detail}.")
    # Responses.
    CONVERSATION_ALREADY_HAS_ACTIVE_RESPONSE = (
        "conversation_already_has_active_response",
        _INVALID,
        "Conversation already has an active response in progress: {response_id}. Wait until the"
        " response is finished before creating a new one.",
    )
    RESPONSE_CANCEL_NOT_ACTIVE = (
        "response_cancel_not_active",
        _INVALID,
        "Cancellation failed: no active response found.",
    )
    OUTPUT_AUDIO_BUFFER_EMPTY = (
        "output_audio_buffer_empty",
        _INVALID,
        "There is no output audio to clear: no response has spoken in this session yet.",
    )
    # Connection lifetime and server faults.
    SESSION_LIMIT_REACHED = (
        "session_limit_reached",
        _SERVER,
        "The server is at its limit of {max_sessions} concurrent sessions; try again later.",
    )
    IDLE_TIMEOUT = ("idle_timeout", _INVALID, "Session closed after {idle_s} s without client events.")
    SERVER_ERROR = ("server_error", _SERVER, "The server had an error while processing your request.")
    CONTEXT_LENGTH_EXCEEDED = (
        "context_length_exceeded",
        _INVALID,
        "Response '{response_id}' failed: the conversation does not fit the model's context ({detail}) and"
        " truncation is off or cannot help; the new input items were removed from the conversation (enable"
        " truncation, delete items or send a shorter message).",
    )
    ENGINE_ERROR = (
        "engine_error",
        _SERVER,
        "The model engine failed while generating response '{response_id}'.",
    )
    ENGINE_UNAVAILABLE = (
        "engine_unavailable",
        _SERVER,
        "The model engine is unavailable, so response '{response_id}' failed; the server is restarting or"
        " shutting down. Reconnect and retry.",
    )
    REPLICA_LOST = (
        "replica_lost",
        _SERVER,
        "The server replica that held this session stopped unexpectedly; the session and its conversation are"
        " gone. Reconnect to continue on another replica.",
    )
    ENGINE_OVERLOADED = (
        "engine_overloaded",
        _SERVER,
        "The model engine is at capacity; response '{response_id}' was not started. Retry shortly.",
    )
    ENGINE_ADMISSION_FAILED = (
        "engine_admission_failed",
        _SERVER,
        "The model engine could not prepare the prompt of response '{response_id}'; later responses are unaffected.",
    )
    ENGINE_TASK_UNAVAILABLE = (
        "engine_task_unavailable",
        _SERVER,
        "The model engine does not run the task of response '{response_id}' (e.g. the turn judgement is off).",
    )
    INVALID_PROMPT = (
        "invalid_prompt",
        _INVALID,
        "Response '{response_id}' cannot be generated from this conversation: {detail}.",
    )
    TRANSCRIPTION_FAILED = (
        "transcription_failed",
        _SERVER,
        "Transcription of item '{item_id}' failed: {reason}.",
    )
    INVALID_TOOL_CALL = (
        "invalid_tool_call",
        _SERVER,
        "Response '{response_id}' failed: the model wrote a malformed function call ({detail}); the call was"
        " neither run nor spoken, and the conversation is unchanged apart from this response.",
    )
    TOOL_CHOICE_UNKNOWN_FUNCTION = (
        "tool_choice_unknown_function",
        _INVALID,
        "tool_choice names the function '{name}', which is not among the tools ({names}).",
    )
    MCP_TOOLS_DISABLED = (
        "mcp_tools_disabled",
        _INVALID,
        "Remote MCP tools are off on this server: it calls only the hosts its operator lists in"
        " server.mcp.allowed_hosts, and that list is empty. Use function tools, or ask the operator to list the host.",
    )
    MCP_SERVER_NOT_ALLOWED = (
        "mcp_server_not_allowed",
        _INVALID,
        "The MCP server host '{host}' is not one this server may call (server.mcp.allowed_hosts: {allowed}).",
    )
    MCP_LIST_TOOLS_FAILED = (
        "mcp_list_tools_failed",
        _SERVER,
        "Listing the tools of MCP server '{server_label}' failed ({detail}); its tools are not offered to the model.",
    )
    MCP_APPROVAL_REQUEST_NOT_FOUND = (
        "mcp_approval_request_not_found",
        _INVALID,
        "No mcp_approval_request item '{item_id}' is waiting for an answer in this conversation.",
    )
    SERVER_SHUTTING_DOWN = (
        "server_shutting_down",
        _SERVER,
        "The server is shutting down; response '{response_id}' was not started. Reconnect and retry.",
    )

    def render(self, **values: object) -> str:
        """Fill the message template; raises `KeyError` when a placeholder has no value."""
        return self.template.format(**values)
