"""ChatFormat frames any chat template as token deltas equal to the template's whole rendering, or refuses."""

import copy
from functools import cache

import pytest
from transformers import PreTrainedTokenizerFast

from engine.models.tokenizer import train_tokenizer
from engine.rollout.chat import ChatFormat

# Like SmolLM2-Instruct's: ChatML, with a default system line when the conversation has none.
SMOL_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
LLAMA3_TEMPLATE = (
    "{{ '<|begin_of_text|>' }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{{ message['content'] + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
LLAMA3_TOKENS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
# Not incremental: only the last user message is shown.
LAST_USER_ONLY = (
    "{% for message in messages %}{% if message['role'] != 'user' or loop.last %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Not incremental at the token level: the prompt's trailing space joins the content's first word or
# punctuation in the whole rendering (" <"), but is a token of its own at the end of the prompt.
SPACE_BEFORE_CONTENT = (
    "{% for message in messages %}{{ message['role'] + ': ' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
)
# Not incremental: like reasoning templates, assistant turns before the last user message lose their <think>.
STRIPS_THINKING = (
    "{% set ns = namespace(last_user=0) %}"
    "{% for message in messages %}{% if message['role'] == 'user' %}{% set ns.last_user = loop.index0 %}"
    "{% endif %}{% endfor %}"
    "{% for message in messages %}{% set content = message['content'] %}"
    "{% if message['role'] == 'assistant' and loop.index0 < ns.last_user %}"
    "{% set content = content.split('</think>')[-1] %}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Like Qwen3's: an assistant's reasoning is re-rendered as "<think>\\n...\\n</think>\\n\\n".
REFORMATS_THINKING = (
    "{% for message in messages %}{% set content = message['content'] %}"
    "{% if '</think>' in content %}{% set parts = content.split('</think>') %}"
    "{% set content = '<think>\\n' + parts[0].split('<think>')[-1] + '\\n</think>\\n\\n' + parts[-1] %}"
    "{% endif %}{{ '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Not incremental: nothing special (nor eos) closes an assistant turn, so no stop token can end a generation.
PLAIN_CLOSE = (
    "{% for message in messages %}{{ message['role'] + ':\\n' + message['content'] + '\\n\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'assistant:\\n' }}{% endif %}"
)
INSTRUCTIONS = "FrozenLake: walk from S to G without falling into a hole H."
OBSERVATIONS = [
    "PFFF\nFHFH\nFFFH\nHFFG\nMove: left, down, right or up?",
    "SFFF\nPHFH\nFFFH\nHFFG\nMove: left, down, right or up?",
    "SFFF\nFHFH\nPFFH\nHFFG\nMove: left, down, right or up?",
]
ACTIONS = ["<answer>down</answer>", "I think the best move is down. <answer>down</answer>"]


@cache
def tiny() -> PreTrainedTokenizerFast:
    return train_tokenizer(vocab_size=1024, seed=0)


def with_template(template: str | None, extra_special: list[str] | None = None) -> PreTrainedTokenizerFast:
    tok = copy.deepcopy(tiny())
    if extra_special:
        tok.add_special_tokens({"additional_special_tokens": extra_special})
    tok.chat_template = template
    return tok


TOKENIZERS = {
    "tiny": tiny,
    "smol": lambda: with_template(SMOL_TEMPLATE),
    "llama3": lambda: with_template(LLAMA3_TEMPLATE, LLAMA3_TOKENS),
}


def enc(tok: PreTrainedTokenizerFast, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def messages(instructions: str) -> list[dict[str, str]]:
    out = [{"role": "system", "content": instructions}] if instructions else []
    out.append({"role": "user", "content": OBSERVATIONS[0]})
    for action, observation in zip(ACTIONS, OBSERVATIONS[1:], strict=True):
        out += [{"role": "assistant", "content": action}, {"role": "user", "content": observation}]
    return out


@pytest.mark.parametrize("name", TOKENIZERS)
@pytest.mark.parametrize("instructions", [INSTRUCTIONS, ""])
@pytest.mark.parametrize("stopped", [True, False])
def test_deltas_of_three_turns_are_the_whole_rendering_token_for_token(
    name: str, instructions: str, stopped: bool
) -> None:
    tok = TOKENIZERS[name]()
    chat = ChatFormat(tok)
    context = chat.first(instructions, OBSERVATIONS[0])
    for action, observation in zip(ACTIONS, OBSERVATIONS[1:], strict=True):
        action_ids = enc(tok, action) + ([chat.stop_id] if stopped else [])  # cut off: no stop token
        assert chat.decode(action_ids) == action
        context += action_ids + chat.next(observation, action_ids)
    whole = tok.apply_chat_template(
        messages(instructions), tokenize=True, add_generation_prompt=True, return_dict=False
    )
    assert context == whole
    assert len(context) > 100


@pytest.mark.parametrize(
    ("name", "stop"), [("tiny", "<|im_end|>"), ("smol", "<|im_end|>"), ("llama3", "<|eot_id|>")]
)
def test_the_stop_token_is_the_one_that_ends_the_templates_turns(name: str, stop: str) -> None:
    tok = TOKENIZERS[name]()
    assert ChatFormat(tok).stop_id == tok.convert_tokens_to_ids(stop)


def test_chatml_framing_and_the_default_system_line() -> None:
    tok = TOKENIZERS["smol"]()
    chat = ChatFormat(tok)
    default = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM<|im_end|>\n"
    first = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode(chat.first("", "hi")) == default + first
    assert tok.decode(chat.first("Be brief.", "hi")).startswith("<|im_start|>system\nBe brief.<|im_end|>\n")
    turn = "<|im_start|>user\nobs<|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode(chat.next("obs", [chat.stop_id])) == "\n" + turn
    assert tok.decode(chat.next("obs", enc(tok, "<answer>up"))) == "<|im_end|>\n" + turn
    assert tok.decode(chat.next("obs", [])) == "<|im_end|>\n" + turn  # an empty generation is closed too


def test_llama3_framing() -> None:
    tok = TOKENIZERS["llama3"]()
    chat = ChatFormat(tok)
    assert tok.decode(chat.first("Be brief.", "hi")) == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    turn = (
        "<|start_header_id|>user<|end_header_id|>\n\nobs<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert tok.decode(chat.next("obs", [chat.stop_id])) == turn
    assert tok.decode(chat.next("obs", enc(tok, "<answer>up"))) == "<|eot_id|>" + turn
    assert chat.decode([*enc(tok, "<answer>up</answer>"), chat.stop_id]) == "<answer>up</answer>"


@pytest.mark.parametrize(
    ("template", "where"),
    [
        (
            LAST_USER_ONLY,
            "at token 17, after 'ructions.<|im_end|>\\n<|im_start|>': the template gives "
            "tokens ['assistant', '\\n', '<', 't', 'h', 'ink'], the deltas give ['user', '\\n', 'First'",
        ),
        (
            SPACE_BEFORE_CONTENT,
            "at token 29, after 'be observation.<|im_end|>\\nassistant:': the template gives tokens "
            "[' <', 't', 'h', 'ink', '>', 'f'], the deltas give [' ', '<', 't', 'h', 'ink', '>']",
        ),
        (STRIPS_THINKING, "changes the earlier ones at character 74: '<think>first probe thought</think>"),
        (REFORMATS_THINKING, "does not render assistant content verbatim"),
        (PLAIN_CLOSE, "it closes an assistant turn with '\\n\\n', neither a special token nor eos"),
    ],
)
def test_a_template_that_is_not_incremental_is_refused_saying_where(template: str, where: str) -> None:
    with pytest.raises(ValueError, match="cannot be rendered incrementally") as refused:
        ChatFormat(with_template(template))
    assert where in str(refused.value)


def test_a_tokenizer_without_a_chat_template_is_refused() -> None:
    with pytest.raises(ValueError, match="tokenizer has no chat template"):
        ChatFormat(with_template(None))


def test_a_template_that_rejects_the_probe_conversation_is_refused() -> None:
    template = "{{ raise_exception('System role not supported') }}"
    refusal = "chat template fails on a probe conversation: System role not supported"
    with pytest.raises(ValueError, match=refusal):
        ChatFormat(with_template(template))


def test_a_repeated_text_is_rendered_and_tokenised_once_and_each_caller_gets_its_own_list(
    monkeypatch,
) -> None:
    chat = ChatFormat(with_template(SMOL_TEMPLATE))
    rendered: list[bool] = []
    render = chat._render
    monkeypatch.setattr(
        chat, "_render", lambda m, generation_prompt: rendered.append(True) or render(m, generation_prompt)
    )
    stop = [chat.stop_id]
    first, again = chat.first(INSTRUCTIONS, OBSERVATIONS[0]), chat.first(INSTRUCTIONS, OBSERVATIONS[0])
    turn, turn_again = chat.next(OBSERVATIONS[1], stop), chat.next(OBSERVATIONS[1], stop)
    assert len(rendered) == 2 and first == again and turn == turn_again
    first.append(-1)
    turn.append(-1)
    assert (
        chat.first(INSTRUCTIONS, OBSERVATIONS[0]) == again and chat.next(OBSERVATIONS[1], stop) == turn_again
    )
    # the close still follows the action: one cut off before the stop token gets the whole close first
    assert chat.next(OBSERVATIONS[1], [5]) == chat._close_ids + turn_again[len(chat._after_stop) :]
    assert len(rendered) == 2
