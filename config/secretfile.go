package config

import (
	"errors"
	"fmt"
	"io"
	"os"
)

// SecretFileLimit bounds what a *_file secret key may hold: a DSN, a
// password or a few webhook secrets fit in it many times over.
const SecretFileLimit = 64 << 10

// errTooLarge: a secret file holds more than SecretFileLimit bytes.
var errTooLarge = errors.New("larger than the limit")

// readSecretFile returns the contents of path, which must be a regular file
// (or a symlink to one, as Kubernetes mounts secrets) of at most
// SecretFileLimit bytes. A device (/dev/zero), a FIFO, a socket or a
// directory is refused before it is opened, so a wrong path can neither
// hang the start nor fill memory; a larger file is refused after reading
// one byte past the limit.
func readSecretFile(path string) ([]byte, error) {
	if err := CheckRegularFile(path); err != nil {
		return nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	// The path may have been replaced between the check and the open.
	if err := regular(path, f.Stat); err != nil {
		return nil, err
	}
	b, err := io.ReadAll(io.LimitReader(f, SecretFileLimit+1))
	if err != nil {
		return nil, err
	}
	if len(b) > SecretFileLimit {
		return nil, fmt.Errorf("file %s is %w of %d bytes (64 KiB) for a secret", path, errTooLarge, SecretFileLimit)
	}
	return b, nil
}

// CheckRegularFile checks that path names a regular file (following
// symlinks) without opening it: opening a FIFO blocks until a writer
// comes, and a device can be read without end.
func CheckRegularFile(path string) error {
	return regular(path, func() (os.FileInfo, error) { return os.Stat(path) })
}

func regular(path string, stat func() (os.FileInfo, error)) error {
	fi, err := stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file (%s)", path, fileKind(fi.Mode()))
	}
	return nil
}

// fileKind names what a non-regular file is, for the message.
func fileKind(m os.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&os.ModeNamedPipe != 0:
		return "a FIFO"
	case m&os.ModeSocket != 0:
		return "a socket"
	case m&os.ModeCharDevice != 0:
		return "a character device"
	case m&os.ModeDevice != 0:
		return "a device"
	default:
		return "mode " + m.Type().String()
	}
}
