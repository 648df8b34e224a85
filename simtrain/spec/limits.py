"""Sizes no real training run approaches: inputs beyond them are refused as bad input.

A count past these limits is a typo or a fuzzer, not a run: accepting it would build a cluster graph,
a schedule or a layer list of that size and run out of time or memory (a 10^30-layer model, a 10^30-
token batch). Each limit is generous, orders of magnitude above the largest published run, so no real
configuration is refused. All counts are plain numbers (no unit) unless the name says otherwise.
"""

from __future__ import annotations

#: GPUs in one job (world size, degrees, nodes x GPUs per node). The largest published runs use about
#: 10^5 GPUs (xAI Colossus, 2024); 10^6 leaves a factor of ten.
MAX_GPUS = 10**6

#: Transformer layers of a model. Published LLMs have at most a few hundred (GPT-3: 96, Llama 3 405B: 126).
MAX_LAYERS = 10**5

#: Hidden size, FFN width, attention heads x head size of a model: the largest are ~5 x 10^4 wide
#: (Llama 3 405B: hidden 16,384, FFN 53,248).
MAX_WIDTH = 10**7

#: Attention heads (query or KV) or experts of a model: hundreds today (DeepSeek-V3: 256 experts, 128 heads).
MAX_HEADS = 10**5

#: Vocabulary size: Gemma's 256k is the largest common one.
MAX_VOCAB = 10**8

#: Tokens of one sequence: million-token contexts exist; 10^9 is a thousand times that.
MAX_SEQ_LEN = 10**9

#: Sequences in one micro-batch.
MAX_MICRO_BATCH = 10**6

#: Micro-batches per data-parallel rank in one optimizer step (global batch / micro-batch / dp): the
#: simulator schedules each one; real runs use at most a few thousand.
MAX_MICROBATCHES = 10**7

#: Tokens in one optimizer step (global batch): DeepSeek-V3's 15,360 x 4,096 is ~6 x 10^7.
MAX_BATCH_TOKENS = 10**12

#: Bytes of a config file simtrain reads (YAML or JSON); real ones are a few kilobytes.
MAX_CONFIG_BYTES = 4 * 1024**2

#: Nodes of a YAML document once its aliases are expanded (a YAML "billion laughs" alias bomb expands
#: to ~10^9 nodes from a few hundred bytes); the largest shipped profiles have a few thousand.
MAX_YAML_NODES = 10**6

#: Nesting depth of a YAML/JSON document (mappings within mappings); configs nest a few levels deep.
MAX_YAML_DEPTH = 100

#: Tokens of a whole training run (``run.tokens``, phase ends): Llama 3 trained on 1.5 x 10^13.
MAX_RUN_TOKENS = 10**18

#: Batch sizes in a run's batch-size schedule (ramp-up increments, table phases): each distinct one is
#: simulated (about a second each), so this also bounds ``simtrain run``'s time; Megatron ramp-ups use tens
#: to hundreds (GPT-3 175B: 32 to 1,536 sequences in steps of 32).
MAX_PHASES = 10**4
