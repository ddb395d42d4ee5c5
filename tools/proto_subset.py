"""Emit byok's own .proto subset from a compiled descriptor set.

Dev tool, not used at run time: `python tools/proto_subset.py DESCRIPTOR_SET OUT_DIR`.
The descriptor set comes from compiling the reference schema with
`protoc --include_imports --descriptor_set_out`. Only the messages reachable from
the roots below are written; names and field numbers are wire facts and are
kept exactly, everything else (comments, ordering of unrelated types) is ours.
"""

from __future__ import annotations

import sys
from pathlib import Path

from google.protobuf import descriptor_pb2

ROOTS = {
    "agent.v1": [
        "AgentClientMessage",
        "AgentServerMessage",
        "ConversationStateStructure",
        "ConversationTurnStructure",
        "AgentConversationTurnStructure",
        "AgentConversationTurn",
        "ConversationStep",
        "UserMessage",
        # Model list (issue 7): AiService serves these same agent.v1 shapes too.
        "GetUsableModelsRequest",
        "GetUsableModelsResponse",
        "GetDefaultModelForCliRequest",
        "GetDefaultModelForCliResponse",
        # Offline answers (PROTOCOL 1.1).
        "UpdateConversationMetadataResponse",
    ],
    "aiserver.v1": [
        "BidiRequestId",
        "BidiAppendRequest",
        "BidiAppendResponse",
        "BidiPollRequest",
        "BidiPollResponse",
        "ErrorDetails",
        "AvailableModelsRequest",
        "AvailableModelsResponse",
        "IsConnectedRequest",
        "IsConnectedResponse",
        "GetDefaultModelRequest",
        "GetDefaultModelResponse",
        # Offline answers (PROTOCOL 1.1). GetServerConfigResponse and
        # GetEffectiveUserPluginsResponse are left out on purpose: byok only ever sends their
        # empty encoding, and their closures would add ~60 messages.
        "GetDefaultModelNudgeDataResponse",
        "GetMeResponse",
        "GetTeamsResponse",
        "GetUserProfileResponse",
        "GetCurrentPeriodUsageResponse",
        "GetUsageLimitStatusAndActiveGrantsResponse",
        "GetUserPrivacyModeResponse",
        "AvailableDocsResponse",
        "KnowledgeBaseListResponse",
        "KnowledgeBaseAddResponse",
        "KnowledgeBaseUpdateResponse",
        "KnowledgeBaseRemoveResponse",
        "WriteGitCommitMessageResponse",
    ],
}
# Fields seen in captured Cursor traffic that the reference schema predates (seeds 000 §21).
EXTRA_FIELDS = {
    "agent.v1.TurnEndedUpdate": ["optional int64 reasoning_tokens = 5;"],
}

GOOGLE_FILES = {
    "Struct": "google/protobuf/struct.proto",
    "Value": "google/protobuf/struct.proto",
    "ListValue": "google/protobuf/struct.proto",
    "NullValue": "google/protobuf/struct.proto",
    "Duration": "google/protobuf/duration.proto",
    "Timestamp": "google/protobuf/timestamp.proto",
    "Empty": "google/protobuf/empty.proto",
}
FILES = {"agent.v1": "agent_v1.proto", "aiserver.v1": "aiserver_v1.proto"}

F = descriptor_pb2.FieldDescriptorProto
SCALARS = {
    F.TYPE_DOUBLE: "double",
    F.TYPE_FLOAT: "float",
    F.TYPE_INT64: "int64",
    F.TYPE_UINT64: "uint64",
    F.TYPE_INT32: "int32",
    F.TYPE_FIXED64: "fixed64",
    F.TYPE_FIXED32: "fixed32",
    F.TYPE_BOOL: "bool",
    F.TYPE_STRING: "string",
    F.TYPE_BYTES: "bytes",
    F.TYPE_UINT32: "uint32",
    F.TYPE_SFIXED32: "sfixed32",
    F.TYPE_SFIXED64: "sfixed64",
    F.TYPE_SINT32: "sint32",
    F.TYPE_SINT64: "sint64",
}


def index(fds: descriptor_pb2.FileDescriptorSet) -> dict[str, tuple[str, object, str]]:
    """Full name (no leading dot) -> (package, descriptor, kind)."""
    out: dict[str, tuple[str, object, str]] = {}

    def walk_msg(pkg: str, prefix: str, m: descriptor_pb2.DescriptorProto) -> None:
        name = f"{prefix}.{m.name}"
        out[name] = (pkg, m, "message")
        for n in m.nested_type:
            walk_msg(pkg, name, n)
        for e in m.enum_type:
            out[f"{name}.{e.name}"] = (pkg, e, "enum")

    for f in fds.file:
        for m in f.message_type:
            walk_msg(f.package, f.package, m)
        for e in f.enum_type:
            out[f"{f.package}.{e.name}"] = (f.package, e, "enum")
    return out


def top_level(full: str, idx: dict) -> str:
    pkg = idx[full][0]
    rest = full[len(pkg) + 1 :]
    return f"{pkg}.{rest.split('.')[0]}"


def closure(idx: dict) -> set[str]:
    seen: set[str] = set()
    todo = [f"{pkg}.{r}" for pkg, roots in ROOTS.items() for r in roots]
    while todo:
        name = todo.pop()
        top = top_level(name, idx)
        if top in seen:
            continue
        seen.add(top)
        stack = [top]
        while stack:
            n = stack.pop()
            _, d, kind = idx[n]
            if kind != "message":
                continue
            for fld in d.field:
                if fld.type_name:
                    ref = fld.type_name.lstrip(".")
                    if ref.startswith("google.protobuf."):
                        seen.add(ref)
                    else:
                        todo.append(ref)
            for nested in d.nested_type:
                stack.append(f"{n}.{nested.name}")
    return seen


def type_ref(fld, pkg: str) -> str:
    if fld.type_name:
        ref = fld.type_name.lstrip(".")
        return ref[len(pkg) + 1 :] if ref.startswith(pkg + ".") else ref
    return SCALARS[fld.type]


def emit_enum(e, ind: str) -> list[str]:
    lines = [f"{ind}enum {e.name} {{"]
    for v in e.value:
        lines.append(f"{ind}  {v.name} = {v.number};")
    lines.append(f"{ind}}}")
    return lines


def emit_msg(m, pkg: str, ind: str, prefix: str = "") -> list[str]:
    full = f"{prefix or pkg}.{m.name}"
    lines = [f"{ind}message {m.name} {{"]
    maps = {n.name: n for n in m.nested_type if n.options.map_entry}
    for n in m.nested_type:
        if not n.options.map_entry:
            lines += emit_msg(n, pkg, ind + "  ", full)
    for e in m.enum_type:
        lines += emit_enum(e, ind + "  ")
    real_oneofs: dict[int, list] = {}
    for fld in m.field:
        if fld.HasField("oneof_index") and not fld.proto3_optional:
            real_oneofs.setdefault(fld.oneof_index, []).append(fld)
    done_oneofs: set[int] = set()
    for fld in m.field:
        if fld.HasField("oneof_index") and not fld.proto3_optional:
            oi = fld.oneof_index
            if oi in done_oneofs:
                continue
            done_oneofs.add(oi)
            lines.append(f"{ind}  oneof {m.oneof_decl[oi].name} {{")
            for of in real_oneofs[oi]:
                lines.append(f"{ind}    {type_ref(of, pkg)} {of.name} = {of.number};")
            lines.append(f"{ind}  }}")
            continue
        entry_name = fld.type_name.split(".")[-1] if fld.type_name else ""
        if fld.label == F.LABEL_REPEATED and entry_name in maps:
            entry = maps[entry_name]
            k, v = entry.field[0], entry.field[1]
            lines.append(f"{ind}  map<{type_ref(k, pkg)}, {type_ref(v, pkg)}> {fld.name} = {fld.number};")
            continue
        label = ""
        if fld.label == F.LABEL_REPEATED:
            label = "repeated "
        elif fld.proto3_optional:
            label = "optional "
        lines.append(f"{ind}  {label}{type_ref(fld, pkg)} {fld.name} = {fld.number};")
    for extra in EXTRA_FIELDS.get(full, ()):
        lines.append(f"{ind}  {extra}")
    lines.append(f"{ind}}}")
    return lines


def main() -> None:
    fds = descriptor_pb2.FileDescriptorSet()
    fds.ParseFromString(Path(sys.argv[1]).read_bytes())
    out_dir = Path(sys.argv[2])
    idx = index(fds)
    keep = closure(idx)
    for pkg, fname in FILES.items():
        body: list[str] = []
        imports: set[str] = set()
        deps: set[str] = set()
        for f in fds.file:
            if f.package != pkg:
                continue
            for e in f.enum_type:
                if f"{pkg}.{e.name}" in keep:
                    body += emit_enum(e, "")
                    body.append("")
            for m in f.message_type:
                if f"{pkg}.{m.name}" in keep:
                    body += emit_msg(m, pkg, "")
                    body.append("")
        text = "\n".join(body)
        for g in sorted(k for k in keep if k.startswith("google.protobuf.")):
            if g in text:
                imports.add(GOOGLE_FILES[g.split(".")[-1]])
        for other, ofile in FILES.items():
            if other != pkg and f"{other}." in text:
                deps.add(ofile)
        head = [
            "// byok's subset of the Cursor wire schema. Generated by tools/proto_subset.py;",
            "// field names and numbers are wire facts.",
            'syntax = "proto3";',
            "",
            f"package {pkg};",
            "",
        ]
        for i in sorted(imports) + sorted(deps):
            head.append(f'import "{i}";')
        (out_dir / fname).write_text("\n".join(head) + "\n\n" + text)


if __name__ == "__main__":
    main()
