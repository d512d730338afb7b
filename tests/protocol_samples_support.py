"""One valid sample of every server event (and the items and responses they carry), as the protocol tests
and the SDK tests build them."""

from __future__ import annotations


from realtime_ming.protocol import (
    AudioFormat,
    Conversation,
    ConversationCreated,
    ConversationItemAdded,
    ConversationItemDeleted,
    ConversationItemDone,
    ConversationItemInputAudioTranscriptionCompleted,
    ConversationItemInputAudioTranscriptionDelta,
    ConversationItemInputAudioTranscriptionFailed,
    ConversationItemRetrieved,
    ConversationItemTruncated,
    Error,
    ErrorCode,
    ErrorDetail,
    FunctionCallItem,
    FunctionCallOutputItem,
    InputAudio,
    InputAudioBufferCleared,
    InputAudioBufferCommitted,
    InputAudioBufferSpeechStarted,
    InputAudioBufferSpeechStopped,
    InputAudioBufferTimeoutTriggered,
    InputImage,
    InputText,
    ItemStatus,
    OutputAudioBufferCleared,
    OutputAudioBufferStarted,
    OutputAudioBufferStopped,
    MessageItem,
    Modality,
    OutputAudio,
    OutputText,
    ProtocolError,
    RateLimit,
    RateLimitName,
    RateLimitsUpdated,
    RealtimeMingResponseTimings,
    Response,
    ResponseContentPartAdded,
    ResponseContentPartDone,
    ResponseCreated,
    ResponseDone,
    ResponseFunctionCallArgumentsDelta,
    ResponseFunctionCallArgumentsDone,
    ResponseOutputAudioDelta,
    ResponseOutputAudioDone,
    ResponseOutputAudioTranscriptDelta,
    ResponseOutputAudioTranscriptDone,
    ResponseOutputItemAdded,
    ResponseOutputItemDone,
    ResponseOutputTextDelta,
    ResponseOutputTextDone,
    ResponseStatus,
    Role,
    SemanticVad,
    ServerEvent,
    SessionConfig,
    SessionCreated,
    SessionUpdated,
    StatusDetails,
    StatusReason,
    TranscriptionDurationUsage,
    TranscriptionTokenUsage,
    Usage,
)
from realtime_ming.protocol.mcp_events import (
    McpListToolsCompleted,
    McpListToolsFailed,
    McpListToolsInProgress,
    ResponseMcpCallArgumentsDelta,
    ResponseMcpCallArgumentsDone,
    ResponseMcpCallCompleted,
    ResponseMcpCallFailed,
    ResponseMcpCallInProgress,
)

RESP, ITEM, USER_ITEM, CALL = "resp_1", "item_2", "item_1", "call_1"
IDX = {"response_id": RESP, "item_id": ITEM, "output_index": 0, "content_index": 0}
PNG = "data:image/png;base64,iVBORw0KGgo="

USER_AUDIO = MessageItem(
    id=USER_ITEM,
    role=Role.USER,
    status=ItemStatus.COMPLETED,
    content=(InputAudio(transcript="what is the weather"),),
)
USER_MIXED = MessageItem(
    id="item_3",
    role=Role.USER,
    status=ItemStatus.COMPLETED,
    content=(InputText("hello"), InputAudio(audio="AAAA", transcript="hi")),
)
USER_IMAGE = MessageItem(id="item_4", role=Role.USER, content=(InputImage(PNG),), status=ItemStatus.COMPLETED)
SYSTEM = MessageItem(
    id="item_5", role=Role.SYSTEM, content=(InputText("be brief"),), status=ItemStatus.COMPLETED
)
ASSISTANT_EMPTY = MessageItem(id=ITEM, role=Role.ASSISTANT, content=(), status=ItemStatus.IN_PROGRESS)
ASSISTANT_AUDIO = MessageItem(
    id=ITEM,
    role=Role.ASSISTANT,
    content=(OutputAudio(transcript="It is sunny."),),
    status=ItemStatus.COMPLETED,
)
ASSISTANT_TEXT = MessageItem(
    id=ITEM, role=Role.ASSISTANT, content=(OutputText("Sunny."),), status=ItemStatus.INCOMPLETE
)
CALL_ITEM = FunctionCallItem(
    id="item_6", call_id=CALL, name="get_weather", arguments='{"city":"Paris"}', status=ItemStatus.COMPLETED
)
CALL_OUTPUT = FunctionCallOutputItem(
    id="item_7", call_id=CALL, output='{"sky":"clear"}', status=ItemStatus.COMPLETED
)

RESPONSE_STARTED = Response(id=RESP, voice="DB30", conversation_id="conv_1")
RESPONSE_CANCELLED = Response(
    id=RESP,
    voice="DB30",
    status=ResponseStatus.CANCELLED,
    status_details=StatusDetails(type=ResponseStatus.CANCELLED, reason=StatusReason.TURN_DETECTED),
    output=(ASSISTANT_AUDIO,),
    usage=Usage(input_text_tokens=12, input_audio_tokens=40, output_text_tokens=5, output_audio_tokens=30),
    conversation_id="conv_1",
    metadata={"topic": "weather"},
    max_output_tokens=512,
    temperature=0.8,
)
RESPONSE_FAILED_TEXT = Response(
    id=RESP,
    voice="DB30",
    status=ResponseStatus.FAILED,
    status_details=StatusDetails(
        type=ResponseStatus.FAILED,
        error=ErrorDetail.from_protocol_error(ProtocolError(ErrorCode.ENGINE_ERROR, response_id=RESP)),
    ),
    output=(ASSISTANT_TEXT, CALL_ITEM),
    output_modalities=(Modality.TEXT,),
    output_format=AudioFormat.pcmu(),
)

SAMPLES: dict[type[ServerEvent], list[ServerEvent]] = {
    Error: [
        Error.from_protocol_error(
            ProtocolError(ErrorCode.UNKNOWN_EVENT, param="type", event_type="x", event_id="c1")
        ),
        Error.from_protocol_error(ProtocolError(ErrorCode.SERVER_ERROR)),
    ],
    SessionCreated: [SessionCreated(session=SessionConfig())],
    SessionUpdated: [
        SessionUpdated(session=SessionConfig(turn_detection=SemanticVad(), output_format=AudioFormat.pcma())),
        SessionUpdated(session=SessionConfig(turn_detection=None, output_modalities=(Modality.TEXT,))),
    ],
    ConversationCreated: [ConversationCreated(conversation=Conversation("conv_1"))],
    InputAudioBufferSpeechStarted: [InputAudioBufferSpeechStarted(audio_start_ms=1200, item_id=USER_ITEM)],
    InputAudioBufferSpeechStopped: [InputAudioBufferSpeechStopped(audio_end_ms=2900, item_id=USER_ITEM)],
    InputAudioBufferTimeoutTriggered: [
        InputAudioBufferTimeoutTriggered(audio_start_ms=3000, audio_end_ms=8000, item_id=USER_ITEM)
    ],
    InputAudioBufferCommitted: [
        InputAudioBufferCommitted(item_id=USER_ITEM, previous_item_id="item_0"),
        InputAudioBufferCommitted(item_id=USER_ITEM),
    ],
    InputAudioBufferCleared: [InputAudioBufferCleared()],
    ConversationItemAdded: [
        ConversationItemAdded(item=USER_AUDIO, previous_item_id=None),
        ConversationItemAdded(item=ASSISTANT_EMPTY, previous_item_id=USER_ITEM),
        ConversationItemAdded(item=SYSTEM),
        ConversationItemAdded(item=CALL_OUTPUT, previous_item_id="item_6"),
    ],
    ConversationItemDone: [ConversationItemDone(item=ASSISTANT_AUDIO, previous_item_id=USER_ITEM)],
    ConversationItemRetrieved: [
        ConversationItemRetrieved(item=USER_MIXED),
        ConversationItemRetrieved(item=CALL_ITEM),
    ],
    ConversationItemTruncated: [ConversationItemTruncated(item_id=ITEM, content_index=0, audio_end_ms=1500)],
    ConversationItemDeleted: [ConversationItemDeleted(item_id=ITEM)],
    ConversationItemInputAudioTranscriptionDelta: [
        ConversationItemInputAudioTranscriptionDelta(item_id=USER_ITEM, content_index=0, delta="what is")
    ],
    ConversationItemInputAudioTranscriptionCompleted: [
        ConversationItemInputAudioTranscriptionCompleted(
            item_id=USER_ITEM,
            content_index=0,
            transcript="what is the weather",
            usage=TranscriptionDurationUsage(1.7),
        ),
        ConversationItemInputAudioTranscriptionCompleted(
            item_id=USER_ITEM, content_index=0, transcript="hi", usage=TranscriptionTokenUsage(20, 3)
        ),
    ],
    ConversationItemInputAudioTranscriptionFailed: [
        ConversationItemInputAudioTranscriptionFailed(
            item_id=USER_ITEM,
            content_index=0,
            error=ErrorDetail(type="server_error", code="transcription_failed", message="ASR failed"),
        )
    ],
    ResponseCreated: [ResponseCreated(response=RESPONSE_STARTED)],
    ResponseDone: [ResponseDone(response=RESPONSE_CANCELLED), ResponseDone(response=RESPONSE_FAILED_TEXT)],
    RateLimitsUpdated: [
        RateLimitsUpdated(
            rate_limits=(
                RateLimit(name=RateLimitName.REQUESTS, limit=1000, remaining=999, reset_seconds=60.0),
                RateLimit(name=RateLimitName.TOKENS, limit=50000, remaining=49000, reset_seconds=1.5),
            )
        )
    ],
    ResponseOutputItemAdded: [
        ResponseOutputItemAdded(response_id=RESP, output_index=0, item=ASSISTANT_EMPTY)
    ],
    ResponseOutputItemDone: [
        ResponseOutputItemDone(response_id=RESP, output_index=0, item=ASSISTANT_AUDIO),
        ResponseOutputItemDone(response_id=RESP, output_index=1, item=CALL_ITEM),
    ],
    ResponseContentPartAdded: [
        ResponseContentPartAdded(**IDX, part=OutputAudio(transcript="")),
        ResponseContentPartAdded(**IDX, part=OutputText("")),
    ],
    ResponseContentPartDone: [ResponseContentPartDone(**IDX, part=OutputAudio(transcript="It is sunny."))],
    ResponseOutputTextDelta: [ResponseOutputTextDelta(**IDX, delta="Sun")],
    ResponseOutputTextDone: [ResponseOutputTextDone(**IDX, text="Sunny.")],
    ResponseOutputAudioDelta: [ResponseOutputAudioDelta(**IDX, delta="AAAAAAAA")],
    ResponseOutputAudioDone: [ResponseOutputAudioDone(**IDX)],
    ResponseOutputAudioTranscriptDelta: [ResponseOutputAudioTranscriptDelta(**IDX, delta="It is")],
    ResponseOutputAudioTranscriptDone: [ResponseOutputAudioTranscriptDone(**IDX, transcript="It is sunny.")],
    ResponseFunctionCallArgumentsDelta: [
        ResponseFunctionCallArgumentsDelta(
            response_id=RESP, item_id="item_6", output_index=1, call_id=CALL, delta='{"ci'
        )
    ],
    ResponseFunctionCallArgumentsDone: [
        ResponseFunctionCallArgumentsDone(
            response_id=RESP,
            item_id="item_6",
            output_index=1,
            call_id=CALL,
            name="get_weather",
            arguments='{"city":"Paris"}',
        )
    ],
    OutputAudioBufferStarted: [OutputAudioBufferStarted(response_id=RESP)],
    OutputAudioBufferStopped: [OutputAudioBufferStopped(response_id=RESP)],
    OutputAudioBufferCleared: [OutputAudioBufferCleared(response_id=RESP)],
    RealtimeMingResponseTimings: [
        RealtimeMingResponseTimings(response_id=RESP, timings={"speech_stopped": 0.0, "first_audio": 212.5})
    ],
    McpListToolsInProgress: [McpListToolsInProgress(item_id="item_l")],
    McpListToolsCompleted: [McpListToolsCompleted(item_id="item_l")],
    McpListToolsFailed: [McpListToolsFailed(item_id="item_l")],
    ResponseMcpCallArgumentsDelta: [
        ResponseMcpCallArgumentsDelta(response_id=RESP, item_id="item_m", output_index=0, delta='{"ci')],
    ResponseMcpCallArgumentsDone: [
        ResponseMcpCallArgumentsDone(response_id=RESP, item_id="item_m", output_index=0, arguments='{"city":"Paris"}')],
    ResponseMcpCallInProgress: [ResponseMcpCallInProgress(item_id="item_m", output_index=0)],
    ResponseMcpCallCompleted: [ResponseMcpCallCompleted(item_id="item_m", output_index=0)],
    ResponseMcpCallFailed: [ResponseMcpCallFailed(item_id="item_m", output_index=0)],
}
ALL_SAMPLES = [(cls.type, event) for cls, events in SAMPLES.items() for event in events]
