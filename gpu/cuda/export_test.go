package cuda

// BuildFake is buildFake for the external tests (package cuda_test).
var BuildFake = buildFake
