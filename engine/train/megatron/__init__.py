"""The Megatron-core training backend (`backends.training: megatron`): a Megatron `GPTModel` behind the
same GRPO loop as the torch backend, loaded from and published as Hugging Face weights."""
