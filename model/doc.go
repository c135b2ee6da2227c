// Package model holds p2ptrain's networks: tensors on a gpu.Device, layers
// with forward and backward passes, the models selected by name ("mlp",
// "cnn", and the decoder-only transformer "gpt" described in
// docs/models.md), optimizers with their schedules, and checkpoints. It
// knows nothing about peers.
//
// # One training step
//
// The step loop (package node) drives a Model like this:
//
//	m, _ := model.New("mlp", model.Config{}, devs, seed)   // one replica per device
//	opt, _ := model.NewOptimizer(model.OptimConfig{Name: "sgd", LR: 0.05}, m)
//	sampler := model.NewSampler(seed, train.Len())
//	for step := start; step < steps; step++ {
//		// one batch per local device, drawn from this node's shard
//		stats, _ := m.ComputeGradients(batches, model.NoiseSeed(seed, step, rank), func(b int) {
//			// bucket b of m.Grads() is complete: start its all-reduce
//			// (m.BucketGrads(b), layout m.Buckets()[b].Shapes())
//		})
//		// wait for every bucket's all-reduce (averaging in place), then
//		m.ApplyGradients(opt, step)
//	}
//
// Parameters live on the host (Params, the master copy the optimizer updates)
// and on every device replica (copied after each update), so replicas on any
// device kind stay bit-identical. Gradients are flat fp32 vectors split into
// fusion buckets in backward order (the last layer's tensors first).
package model
