package config

import (
	"errors"
	"fmt"
	"io"
	"os"
)

// Bounds of the files outboxd reads. Every *_file key and --config is read
// by ReadFile (or, when a library opens the file itself, checked by
// CheckFile) under one rule: a regular file of at most its limit, read at
// the start, and an error naming the key otherwise.
const (
	// SecretFileLimit bounds a secret (DSN, password, webhook secrets,
	// signing key, bearer token), dispatch.webhook.headers_file and a NATS
	// credentials file: each fits in it many times over.
	SecretFileLimit = 64 << 10
	// LargeFileLimit bounds --config and the TLS files (a CA bundle with
	// every public root is a few hundred KiB).
	LargeFileLimit = 1 << 20
)

// errTooLarge: a file holds more than its limit.
var errTooLarge = errors.New("larger than the limit")

// ReadFile returns the contents of path, the value of key, which must be a
// regular file (or a symlink to one, as Kubernetes mounts secrets) of at
// most limit bytes. A device (/dev/zero), a FIFO, a socket or a directory
// is refused before it is opened, so a wrong path can neither hang the
// start nor fill memory; a larger file is refused after reading one byte
// past the limit. Every error is a *KeyError naming key.
func ReadFile(key, path string, limit int64) ([]byte, error) {
	b, err := readFile(path, limit)
	if err != nil {
		return nil, &KeyError{Key: key, Err: err}
	}
	return b, nil
}

func readFile(path string, limit int64) ([]byte, error) {
	if err := checkFile(path, limit); err != nil {
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
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, tooLarge(path, limit)
	}
	return b, nil
}

// CheckFile applies ReadFile's rule to path without opening it (its size
// as the file system reports it): for a file read later, or by a library
// that opens it itself. The error is a *KeyError naming key.
func CheckFile(key, path string, limit int64) error {
	if err := checkFile(path, limit); err != nil {
		return &KeyError{Key: key, Err: err}
	}
	return nil
}

// checkFile: path names a regular file (following symlinks) of at most
// limit bytes. It does not open it: opening a FIFO blocks until a writer
// comes, and a device can be read without end.
func checkFile(path string, limit int64) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if err := regular(path, func() (os.FileInfo, error) { return fi, nil }); err != nil {
		return err
	}
	if fi.Size() > limit {
		return tooLarge(path, limit)
	}
	return nil
}

func tooLarge(path string, limit int64) error {
	return fmt.Errorf("file %s is %w of %d bytes (%d KiB)", path, errTooLarge, limit, limit>>10)
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
