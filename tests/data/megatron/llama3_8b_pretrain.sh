#!/bin/bash
# Llama 3.1 8B pretraining with Megatron-LM (core_r0.13 flag names) on 2 nodes of 8 H100:
# TP2 x PP2 (4 virtual stages per rank) x DP4, sequence parallel, distributed optimizer,
# FP8 delayed scaling, selective recompute. Written by the simtrain authors as a test fixture
# in the style of Megatron-LM's examples/llama launch scripts.

GPUS_PER_NODE=8
NNODES=2
TP=2
PP=2

DISTRIBUTED_ARGS=(
    --nproc_per_node $GPUS_PER_NODE
    --nnodes $NNODES
    --master_addr localhost --master_port 6000
)

MODEL_ARGS=(
    --use-mcore-models
    --num-layers 32
    --hidden-size 4096
    --ffn-hidden-size 14336
    --num-attention-heads 32
    --group-query-attention
    --num-query-groups 8
    --seq-length 8192
    --max-position-embeddings 131072
    --position-embedding-type rope
    --rotary-base 500000
    --swiglu
    --normalization RMSNorm
    --untie-embeddings-and-output-weights
    --disable-bias-linear
    --attention-dropout 0.0
    --hidden-dropout 0.0
    --tokenizer-type HuggingFaceTokenizer
    --tokenizer-model meta-llama/Llama-3.1-8B
    --vocab-size 128256
)

TRAINING_ARGS=(
    --micro-batch-size 1
    --global-batch-size 128   # 1M tokens per step
    --train-iters 10000
    --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine
    --weight-decay 0.1 --clip-grad 1.0
    --bf16
    --fp8-format hybrid
    --fp8-recipe delayed
    --recompute-granularity selective
    --recompute-modules core_attn layernorm
    --cross-entropy-loss-fusion
    --my-experimental-flag 3
)

PARALLEL_ARGS=(
    --tensor-model-parallel-size $TP
    --pipeline-model-parallel-size ${PP}
    --num-layers-per-virtual-pipeline-stage 4
    --sequence-parallel
    --use-distributed-optimizer
    --overlap-grad-reduce
    --overlap-param-gather
    --tp-comm-overlap
)

torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py \
    ${MODEL_ARGS[@]} \
    ${TRAINING_ARGS[@]} \
    ${PARALLEL_ARGS[@]} \
    --data-path /data/llama3_text_document \
    --save /checkpoints/llama3-8b --save-interval 1000 \
    --log-interval 10
