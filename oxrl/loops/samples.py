"""Greedy answers to a few prompts, to show what training changed."""

from __future__ import annotations

import torch


@torch.no_grad()
def generate_samples(model, tokenizer, prompts: list[str], max_new_tokens: int) -> list[dict]:
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    out = []
    for prompt in prompts:
        if tokenizer.chat_template:
            ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                                return_tensors="pt", return_dict=True)["input_ids"]
        else:
            ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        ids = ids.to(device)
        generated = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                   do_sample=False, pad_token_id=tokenizer.pad_token_id)
        completion = tokenizer.decode(generated[0, ids.shape[1]:], skip_special_tokens=True)
        out.append({"prompt": prompt, "completion": completion.strip()})
    model.train(was_training)
    return out
