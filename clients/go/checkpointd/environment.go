package checkpointd

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// DefaultDataDir is where `checkpointd serve` keeps its socket when neither an
// address nor CHECKPOINTD_DATA_DIR is given (the CLI's default too).
const DefaultDataDir = "~/.local/state/checkpointd"

// DefaultWorkspace is the daemon's workspace when neither WithWorkspace nor
// CHECKPOINTD_WORKSPACE says otherwise (the daemon's own default).
const DefaultWorkspace = "/workspace"

// The environment variables Dial reads, as the checkpointd CLI does; an explicit
// argument or option wins over each.
const (
	EnvAddress   = "CHECKPOINTD_ADDRESS"
	EnvDataDir   = "CHECKPOINTD_DATA_DIR"
	EnvToken     = "CHECKPOINTD_TOKEN"
	EnvTLSCA     = "CHECKPOINTD_TLS_CA"
	EnvTLSCert   = "CHECKPOINTD_TLS_CERT"
	EnvTLSKey    = "CHECKPOINTD_TLS_KEY"
	EnvWorkspace = "CHECKPOINTD_WORKSPACE"
)

func expandHome(path string) string {
	if rest, ok := strings.CutPrefix(path, "~"); ok && (rest == "" || rest[0] == '/') {
		if home, err := os.UserHomeDir(); err == nil {
			return home + rest
		}
	}
	return path
}

// fromEnvironment fills what the caller left unset from the environment and
// returns the address to dial.
func fromEnvironment(address string, o *options) (string, error) {
	if address == "" {
		address = os.Getenv(EnvAddress)
	}
	if address == "" {
		dataDir := os.Getenv(EnvDataDir)
		if dataDir == "" {
			dataDir = DefaultDataDir
		}
		socket, err := filepath.Abs(filepath.Join(expandHome(dataDir), "checkpointd.sock"))
		if err != nil {
			return "", invalidArgument(fmt.Sprintf("%s %q: %v", EnvDataDir, dataDir, err),
				map[string]string{"field": EnvDataDir})
		}
		address = "unix://" + socket
	}
	if o.token == nil {
		if token, ok := os.LookupEnv(EnvToken); ok {
			o.token = &token
		}
	}
	if o.workspace == "" {
		o.workspace = os.Getenv(EnvWorkspace)
	}
	if o.workspace == "" {
		o.workspace = DefaultWorkspace
	}
	if o.tls == nil && o.tlsFiles == nil && !isUnix(address) {
		files := [3]string{os.Getenv(EnvTLSCA), os.Getenv(EnvTLSCert), os.Getenv(EnvTLSKey)}
		if files != [3]string{} {
			config, err := tlsFromFiles(files, [3]string{EnvTLSCA, EnvTLSCert, EnvTLSKey})
			if err != nil {
				return "", err
			}
			o.tls = config
		}
	}
	if o.tlsFiles != nil {
		config, err := tlsFromFiles(*o.tlsFiles, [3]string{"ca", "cert", "key"})
		if err != nil {
			return "", err
		}
		o.tls = config
	}
	return address, nil
}

// tlsFromFiles reads a CA and a client certificate and key (PEM); names are
// what the error calls each file.
func tlsFromFiles(files, names [3]string) (*tls.Config, error) {
	ca, cert, key := files[0], files[1], files[2]
	config := &tls.Config{MinVersion: tls.VersionTLS12}
	if ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, invalidArgument(fmt.Sprintf("%s %s: %v", names[0], ca, err), map[string]string{"path": ca})
		}
		config.RootCAs = x509.NewCertPool()
		if !config.RootCAs.AppendCertsFromPEM(pem) {
			return nil, invalidArgument(fmt.Sprintf("%s %s: no PEM certificate in it", names[0], ca),
				map[string]string{"path": ca})
		}
	}
	if (cert == "") != (key == "") {
		return nil, invalidArgument(fmt.Sprintf("%s and %s go together", names[1], names[2]), nil)
	}
	if cert != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, invalidArgument(fmt.Sprintf("%s %s, %s %s: %v", names[1], cert, names[2], key, err),
				map[string]string{"path": cert})
		}
		config.Certificates = []tls.Certificate{pair}
	}
	return config, nil
}
