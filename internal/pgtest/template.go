package pgtest

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

// templateVersion names what a saved template contains. Bump it whenever
// initdb's options or bootstrap change, so that stale templates are not
// used.
const templateVersion = "1"

// templateMarker is written into a template last: a directory without it
// is not a template.
const templateMarker = "fenceproxy_pgtest_template"

// templateDir returns where the data directory template for these binaries
// lives, or "" when there is no cache directory. It lives in the user's
// cache directory rather than in /tmp, where periodic cleaners may delete
// part of it. The key covers the binaries (path, size and time of the
// postgres executable), the harness version and the owner.
func templateDir(binDir string, cred *syscall.Credential) string {
	cache, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	fi, err := os.Stat(filepath.Join(binDir, "postgres"))
	if err != nil {
		return ""
	}
	owner := -1
	if cred != nil {
		owner = int(cred.Uid)
	}
	sum := sha256.Sum256(fmt.Appendf(nil, "%s|%s|%d|%d|%d|%d",
		templateVersion, binDir, fi.Size(), fi.ModTime().UnixNano(), owner, os.Geteuid()))
	return filepath.Join(cache, "fenceproxy", "pgtest-template-"+hex.EncodeToString(sum[:8]))
}

// copyTemplate copies the template into the cluster's data directory and
// reports whether it did. The copy runs as the test's own user: as root it
// can read the template (kept under root's home) and keeps the postgres
// ownership of the files.
func (c *Cluster) copyTemplate(tmpl string) bool {
	if tmpl == "" {
		return false
	}
	if _, err := os.Stat(filepath.Join(tmpl, templateMarker)); err != nil {
		return false
	}
	if out, err := exec.Command("cp", "-a", tmpl, c.dataDir).CombinedOutput(); err != nil {
		// A template being replaced or damaged: fall back to initdb.
		fmt.Fprintf(os.Stderr, "pgtest: copy template %s: %v %s\n", tmpl, err, out)
		_ = os.RemoveAll(c.dataDir)
		return false
	}
	return true
}

// saveTemplate saves the cluster's cleanly shut down data directory as the
// template. It is best effort: without a template, Start runs initdb.
// Parallel test processes may race to save one; the rename makes exactly
// one of them win and nobody see a half-written template.
func (c *Cluster) saveTemplate(tmpl string) {
	parent := filepath.Dir(tmpl)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return
	}
	staging, err := os.MkdirTemp(parent, ".staging-")
	if err != nil {
		return
	}
	defer os.RemoveAll(staging)
	data := filepath.Join(staging, "data")
	if out, err := exec.Command("cp", "-a", c.dataDir, data).CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: save template: %v %s\n", err, out)
		return
	}
	if err := os.WriteFile(filepath.Join(data, templateMarker), []byte(templateVersion+"\n"), 0o644); err != nil {
		return
	}
	if err := os.Rename(data, tmpl); err != nil {
		return // another process saved one first
	}
	// Templates for other binaries or harness versions are dead weight
	// (tens of megabytes each).
	old, _ := filepath.Glob(filepath.Join(parent, "pgtest-template-*"))
	for _, dir := range old {
		if dir != tmpl && !strings.HasPrefix(filepath.Base(dir), ".") {
			_ = os.RemoveAll(dir)
		}
	}
}
