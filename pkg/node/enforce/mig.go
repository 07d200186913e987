package enforce

// planHard plans a MIG device or an exclusive whole GPU (ModeMIG,
// ModeExclusive): the hardware isolates it and nothing is set; nobody else
// can be placed on an exclusive GPU.
func planHard(v *visibleDevice) {
	v.Enforced = Hard
}
