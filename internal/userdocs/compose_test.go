package userdocs

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/fenceproxy/fenceproxy/config"
)

// composeFile is the part of docker-compose.yml the checks read.
type composeFile struct {
	Services map[string]struct {
		Image       string            `yaml:"image"`
		Build       any               `yaml:"build"`
		Environment map[string]string `yaml:"environment"`
		Ports       []string          `yaml:"ports"`
		Volumes     []string          `yaml:"volumes"`
		DependsOn   map[string]struct {
			Condition string `yaml:"condition"`
		} `yaml:"depends_on"`
		Healthcheck struct {
			Test []string `yaml:"test"`
		} `yaml:"healthcheck"`
	} `yaml:"services"`
}

// hostPort maps a published "127.0.0.1:HOST:CONTAINER" port.
type hostPort struct{ ip, host, container string }

func published(t *testing.T, svc string, ports []string) []hostPort {
	t.Helper()
	var out []hostPort
	for _, p := range ports {
		parts := strings.Split(p, ":")
		if len(parts) != 3 {
			t.Errorf("%s: port %q: publish as 127.0.0.1:HOST:CONTAINER (only on loopback)", svc, p)
			continue
		}
		out = append(out, hostPort{parts[0], parts[1], parts[2]})
	}
	return out
}

// The compose stack, its proxy configuration and the README agree: what the README tells a Docker user to export
// reaches the published ports, the password is the one PostgreSQL is given, the proxy protects what the
// Quickstart creates with verification off (the Quickstart's hand-set tokens would be refused on a fresh etcd),
// no seed data collides with the Quickstart's INSERT, every service has a healthcheck, and no host port clashes
// with a packaged PostgreSQL, pgbouncer or etcd.
func TestComposeAgreesWithQuickstart(t *testing.T) {
	root := repoRoot(t)
	var cf composeFile
	if err := yaml.Unmarshal([]byte(readRepoFile(t, "docker-compose.yml")), &cf); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	for _, name := range []string{"postgres", "etcd", "fenceproxy"} {
		if _, ok := cf.Services[name]; !ok {
			t.Fatalf("docker-compose.yml has no service %q", name)
		}
	}
	pgSvc, fpSvc := cf.Services["postgres"], cf.Services["fenceproxy"]

	// Host ports: on loopback, none of the well-known ones.
	hostPorts := map[string]map[string]string{} // service -> container port -> host port
	for name, svc := range cf.Services {
		hostPorts[name] = map[string]string{}
		for _, p := range published(t, name, svc.Ports) {
			if p.ip != "127.0.0.1" {
				t.Errorf("%s publishes on %s, not loopback", name, p.ip)
			}
			if slices.Contains([]string{"5432", "6432", "2379", "2380", "9187"}, p.host) {
				t.Errorf("%s publishes host port %s, which a packaged PostgreSQL, pgbouncer, etcd or exporter may hold", name, p.host)
			}
			hostPorts[name][p.container] = p.host
		}
		if len(svc.Healthcheck.Test) == 0 {
			t.Errorf("%s has no healthcheck", name)
		}
	}
	pgHost, etcdHost := hostPorts["postgres"]["5432"], hostPorts["etcd"]["2379"]
	if pgHost == "" || etcdHost == "" {
		t.Fatalf("PostgreSQL (5432) and etcd (2379) must be published for the Quickstart: %v", hostPorts)
	}
	for dep := range fpSvc.DependsOn {
		if fpSvc.DependsOn[dep].Condition != "service_healthy" {
			t.Errorf("fenceproxy starts before %s is healthy", dep)
		}
	}

	// The proxy's configuration: the file mounted where the image's CMD reads it, valid, and matching.
	const inImage = "/etc/fenceproxy/fenceproxy.yaml"
	if df := readRepoFile(t, "Dockerfile"); !strings.Contains(df, inImage) {
		t.Errorf("the Dockerfile's CMD does not read %s", inImage)
	}
	var cfgRel string
	for _, v := range fpSvc.Volumes {
		if src, dst, ok := strings.Cut(v, ":"); ok && strings.HasPrefix(dst, inImage) {
			cfgRel = strings.TrimPrefix(src, "./")
		}
	}
	if cfgRel == "" {
		t.Fatalf("fenceproxy service mounts nothing at %s: %v", inImage, fpSvc.Volumes)
	}
	cfg, err := config.Load(filepath.Join(root, cfgRel))
	if err != nil {
		t.Fatalf("%s: %v", cfgRel, err)
	}
	_, listenPort, _ := net.SplitHostPort(cfg.Listen)
	proxyHost := hostPorts["fenceproxy"][listenPort]
	if proxyHost == "" {
		t.Errorf("fenceproxy listens on %s in %s, but that port is not published: %v", cfg.Listen, cfgRel, fpSvc.Ports)
	}
	_, metricsPort, _ := net.SplitHostPort(cfg.Metrics.Listen)
	metricsHost := hostPorts["fenceproxy"][metricsPort]
	if cfg.Metrics.Listen == "" || metricsHost == "" {
		t.Errorf("metrics (%q) must be on and published: the healthcheck and the README use /healthz", cfg.Metrics.Listen)
	}
	if hc := strings.Join(fpSvc.Healthcheck.Test, " "); !strings.Contains(hc, "/healthz") || !strings.Contains(hc, "/"+metricsPort) {
		t.Errorf("fenceproxy's healthcheck does not ask /healthz on the metrics port %s: %s", metricsPort, hc)
	}
	if cfg.Upstream.Address != "postgres:5432" {
		t.Errorf("upstream.address %q, want the postgres service (postgres:5432)", cfg.Upstream.Address)
	}
	if len(cfg.Token.Verify.Etcd.Endpoints) > 0 {
		t.Errorf("%s turns token verification on: the Quickstart's hand-set tokens 1 and 2 exceed a fresh etcd's revision and would be refused (55F03)", cfgRel)
	}

	// The Quickstart's tables and the compose configuration's are the same.
	qs := strings.Join(codeBlocks(t, readRepoFile(t, "README.md"), "sh quickstart"), "\n")
	qsYAML := regexp.MustCompile(`(?s)<<'?YAML'?\n(.*?)\nYAML\n`).FindStringSubmatch(qs)
	if qsYAML == nil {
		t.Fatal("the Quickstart writes no fenceproxy.yaml")
	}
	expanded := os.Expand(qsYAML[1], func(v string) string {
		return map[string]string{"PROXY_PORT": "16432", "PGHOST": "127.0.0.1", "PGPORT": "5432"}[v]
	})
	qcfg, err := config.Parse("quickstart.yaml", []byte(expanded))
	if err != nil {
		t.Fatalf("the Quickstart's YAML: %v", err)
	}
	if fmt.Sprint(qcfg.Tables) != fmt.Sprint(cfg.Tables) {
		t.Errorf("tables differ: Quickstart %+v, %s %+v", qcfg.Tables, cfgRel, cfg.Tables)
	}

	// No seed data: the Quickstart creates the table and inserts id 1 itself.
	for _, v := range pgSvc.Volumes {
		if strings.Contains(v, "docker-entrypoint-initdb.d") {
			src, _, _ := strings.Cut(v, ":")
			b, err := os.ReadFile(filepath.Join(root, src))
			if err != nil {
				t.Fatal(err)
			}
			if s := strings.ToUpper(string(b)); strings.Contains(s, "INSERT") || strings.Contains(s, "CREATE TABLE ACCOUNTS") || strings.Contains(s, "CREATE TABLE PUBLIC.ACCOUNTS") {
				t.Errorf("%s creates or fills accounts, which the Quickstart creates and fills: its CREATE TABLE or INSERT would fail", src)
			}
		}
	}

	// The README's Docker paragraph: the exports reach the published ports with the password PostgreSQL has.
	readme := readRepoFile(t, "README.md")
	password := pgSvc.Environment["POSTGRES_PASSWORD"]
	for _, want := range []string{
		"PGPORT=" + pgHost, "PGPASSWORD=" + password, "PROXY_PORT=" + proxyHost,
		"FENCEPROXY_ETCD_ENDPOINTS=127.0.0.1:" + etcdHost, "password `" + password + "`",
		"127.0.0.1:" + metricsHost,
	} {
		if password == "" || !strings.Contains(readme, want) {
			t.Errorf("the README's Docker paragraph lacks %q (docker-compose.yml and the README disagree)", want)
		}
	}
	if fpSvc.Environment["PGPASSWORD"] != password || fpSvc.Environment["PGHOST"] != "postgres" {
		t.Errorf("the fenceproxy service's PGHOST and PGPASSWORD (for the Docker steps) are not the postgres service's")
	}

	// A Docker user gets every Quickstart step (create the table, check, the story, the lock) through
	// docker compose exec, in the proxy's container, which therefore has psql.
	docker := readme[strings.Index(readme, "**With Docker**"):]
	docker = docker[:strings.Index(docker, "\n## ")]
	for _, want := range []string{
		`fp() { docker compose exec -T fenceproxy "$@"; }`,
		"fp psql -c 'CREATE TABLE accounts",
		"fp fenceproxy check --config " + inImage,
		"fp psql -h 127.0.0.1 -p " + listenPort,
		"fp fenceproxy lock --pg \"host=postgres\" settlement -- psql -h 127.0.0.1 -p " + listenPort,
	} {
		if !strings.Contains(docker, want) {
			t.Errorf("the README's Docker steps lack %q", want)
		}
	}
	if df := readRepoFile(t, "Dockerfile"); !strings.Contains(df, "postgresql-client") {
		t.Error("the image has no psql (postgresql-client), which the README's Docker steps run in it")
	}
	// The compose file's header says what the README says: the same exports, etcd's included.
	exports := regexp.MustCompile(`PGHOST=127\.0\.0\.1 PGPORT=\S+ PGUSER=\S+ PGPASSWORD=\S+ PROXY_PORT=\S+ FENCEPROXY_ETCD_ENDPOINTS=\S+`).FindString(readme)
	header, _, _ := strings.Cut(readRepoFile(t, "docker-compose.yml"), "services:")
	if exports == "" || !strings.Contains(header, strings.TrimSuffix(exports, "`")) {
		t.Errorf("docker-compose.yml's header does not list the README's exports %q:\n%s", exports, header)
	}
}

// The image's build context leaves out what is not source: the binary, .git, benchmark results.
func TestDockerignore(t *testing.T) {
	ignore := strings.Fields(readRepoFile(t, ".dockerignore"))
	for _, want := range []string{".git", "/fenceproxy", "bench/results"} {
		if !slices.Contains(ignore, want) {
			t.Errorf(".dockerignore does not exclude %s", want)
		}
	}
}
