// Package pipeline runs a model cut into stages across peers (pipeline
// parallelism, docs/pipeline.md): it balances the cut from measured
// per-layer times (Balance), orders each stage's micro-batches (Schedule:
// GPipe or 1F1B), moves activations forward and their gradients backward
// through a Transport, compressed by a package compress codec, and keeps
// the token table the gpt's first and last stages share in step (SumTied).
// Project predicts the step time of pure data parallelism and of each
// hybrid layout of S stages × R replicas from link and compute figures.
//
// It does no IO of its own: a Transport carries the messages (MemNetwork
// in memory, protocol/pipestream between peers). Assign lays a ring
// epoch's members out as stages × replicas; package train runs a stage per
// peer (train.pipeline_stages).
package pipeline
