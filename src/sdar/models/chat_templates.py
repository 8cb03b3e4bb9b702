"""ChatML chat templates: Qwen2.5's template verbatim, parameterised only by its default system prompt.

The tiny tokenizer and the Qwen vocabulary share one template, so prompts are formatted the same way
for the tiny model, SmolLM2-style ChatML models and real Qwen2.5 checkpoints.
"""

from __future__ import annotations

# Qwen2.5-Instruct's default system prompt (used when a conversation has no system message)
QWEN25_DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
# what the locally trained tokenizer says when there is no system message
DEFAULT_SYSTEM = "You are a helpful assistant."

# The Qwen2.5-Instruct template (tokenizer_config.json of Qwen/Qwen2.5-*-Instruct), with the
# default system prompt replaced by a placeholder. Tool calls and tool responses are kept so that
# real Qwen2.5 checkpoints see the exact formatting they were trained on.
_QWEN25_TEMPLATE = (
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n"
    "    {%- else %}\n"
    "        {{- '@@DEFAULT_SYSTEM@@' }}\n"
    "    {%- endif %}\n"
    "    {{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n"
    "    {%- for tool in tools %}\n"
    "        {{- \"\\n\" }}\n"
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    "    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, "
    "\\\"arguments\\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n"
    "{%- else %}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "    {%- else %}\n"
    "        {{- '<|im_start|>system\\n@@DEFAULT_SYSTEM@@<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or "
    "(message.role == \"assistant\" and not message.tool_calls) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "    {%- elif message.role == \"assistant\" %}\n"
    "        {{- '<|im_start|>' + message.role }}\n"
    "        {%- if message.content %}\n"
    "            {{- '\\n' + message.content }}\n"
    "        {%- endif %}\n"
    "        {%- for tool_call in message.tool_calls %}\n"
    "            {%- if tool_call.function is defined %}\n"
    "                {%- set tool_call = tool_call.function %}\n"
    "            {%- endif %}\n"
    "            {{- '\\n<tool_call>\\n{\"name\": \"' }}\n"
    "            {{- tool_call.name }}\n"
    "            {{- '\", \"arguments\": ' }}\n"
    "            {{- tool_call.arguments | tojson }}\n"
    "            {{- '}\\n</tool_call>' }}\n"
    "        {%- endfor %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == \"tool\" %}\n"
    "        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != \"tool\") %}\n"
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n"
    "        {{- '\\n</tool_response>' }}\n"
    "        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n"
    "            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)


def chatml_template(default_system: str = DEFAULT_SYSTEM) -> str:
    """The Qwen2.5 ChatML template with `default_system` as the prompt used when none is given.

    `chatml_template(QWEN25_DEFAULT_SYSTEM)` is byte-for-byte Qwen2.5-Instruct's template.
    """
    if "'" in default_system or "\\" in default_system or "\n" in default_system:
        raise ValueError(
            f"default system prompt {default_system!r} contains a quote, backslash or newline, "
            "which would break the Jinja string literal; pass plain one-line text"
        )
    return _QWEN25_TEMPLATE.replace("@@DEFAULT_SYSTEM@@", default_system)


QWEN25_CHAT_TEMPLATE = chatml_template(QWEN25_DEFAULT_SYSTEM)
