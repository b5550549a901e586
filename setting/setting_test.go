package setting

import "testing"

func TestValidate(t *testing.T) {
	for _, ok := range []string{"fence.token", "fence.lock", "app.fence_token", "a.b.c", "_x.y$1", "x.y_2"} {
		if err := Validate(ok); err != nil {
			t.Errorf("Validate(%q) = %v, want nil", ok, err)
		}
	}
	long := "a." + string(make([]byte, 0))
	for i := 0; i < 64; i++ {
		long += "b"
	}
	for _, bad := range []string{"", "token", ".token", "fence.", "fence..token", "Fence.token", "fence.Token",
		"fence.1token", "fence.$x", "fence.to|ken", "fence.to-ken", "fence.tök", "fence.to ken", "fence.t'", long} {
		if err := Validate(bad); err == nil {
			t.Errorf("Validate(%q) = nil, want an error", bad)
		}
	}
}
