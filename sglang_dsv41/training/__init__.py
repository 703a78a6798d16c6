"""Training of the retrieval model (docs/retrieval_model.md), one idea per module:

task          the task: facts, question, document, raw and chat forms, name split
filler        the English filler sources (training and held out), shipped with CPython
examples      token sequences with their answer targets, as a server tokenizes them
curriculum    stages of lengths, facts and attention modes; the data of each step
straight_through  the KV records' quantization with an identity gradient
dense_attention   attention over every visible entry (the indexer's dense warm-up)
attention     one attention sublayer with gradients, dense or sparse, and what the
              indexer is distilled from
forward       the model's training forward (the oracle's, with gradients)
distill       the indexer's KL distillation loss
init          starting weights
probe         a held-out check during training
export        the servable checkpoint directory
train         the loop and its command line
"""
