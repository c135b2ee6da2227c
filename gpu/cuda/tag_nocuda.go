//go:build nocuda

package cuda

// builtWithoutLoader is true in a build with -tags nocuda, which leaves
// purego out for a fully static binary.
const builtWithoutLoader = true
