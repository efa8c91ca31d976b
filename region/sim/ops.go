package sim

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/computeql/computeql/region"
)

// The operational verbs: each acts on one server and returns at once; the
// state then walks on with the clock and every step is an event.

func imageKey(id string) string                   { return prefix + "img:" + id }
func projectImagesKey(org, project string) string { return prefix + "imgs:" + org + "/" + project }
func sshKeyKey(org, project string) string        { return prefix + "sshkey:" + org + "/" + project }

// imageDuePrefix marks images among the due set's members: a snapshot becomes ready on the
// same clock as servers move on.
const imageDuePrefix = "img:"

// GetServer implements region.Client.
func (s *Sim) GetServer(ctx context.Context, id string) (region.Server, error) {
	if err := s.call(ctx, "get server"); err != nil {
		return region.Server{}, err
	}
	return s.read(ctx, s.rdb, id)
}

// power moves a server from the state it must be in to a transitional one that the clock ends.
func (s *Sim) power(ctx context.Context, op, id string, from, to region.ServerState) (region.Server, error) {
	if err := s.call(ctx, op); err != nil {
		return region.Server{}, err
	}
	srv, err := s.update(ctx, id, func(srv *region.Server) (time.Time, error) {
		if srv.State != from {
			return time.Time{}, fmt.Errorf("cannot %s a server that is %s: %w", op, srv.State, region.ErrRefused)
		}
		srv.State = to
		return s.opts.Now().Add(s.opts.PowerDelay), nil
	})
	if err != nil {
		return region.Server{}, fmt.Errorf("%s server: %w", op, err)
	}
	return srv, nil
}

// StopServer implements region.Client.
func (s *Sim) StopServer(ctx context.Context, id string) (region.Server, error) {
	return s.power(ctx, "stop", id, region.ServerRunning, region.ServerStopping)
}

// StartServer implements region.Client.
func (s *Sim) StartServer(ctx context.Context, id string) (region.Server, error) {
	return s.power(ctx, "start", id, region.ServerStopped, region.ServerStarting)
}

// RebootServer implements region.Client; a soft and a hard reboot look alike from outside.
func (s *Sim) RebootServer(ctx context.Context, id string, hard bool) (region.Server, error) {
	op := "reboot"
	if hard {
		op = "hard-reboot"
	}
	return s.power(ctx, op, id, region.ServerRunning, region.ServerRebooting)
}

// runningServer reads a server that must be running for op.
func (s *Sim) runningServer(ctx context.Context, op, id string) (region.Server, error) {
	if err := s.call(ctx, op); err != nil {
		return region.Server{}, err
	}
	srv, err := s.read(ctx, s.rdb, id)
	if err != nil {
		return region.Server{}, fmt.Errorf("%s: %w", op, err)
	}
	if srv.State != region.ServerRunning {
		return region.Server{}, fmt.Errorf("%s: the server is %s, not RUNNING: %w", op, srv.State, region.ErrRefused)
	}
	return srv, nil
}

// OpenConsole implements region.Client with a console that echoes what is typed, as a
// guest's login prompt would (a carriage return echoed as a new line): what came before is
// the boot log ConsoleOutput shows. A newer attachment to the server, through this process,
// ends the older one's reads.
func (s *Sim) OpenConsole(ctx context.Context, id string) (io.ReadWriteCloser, error) {
	if _, err := s.runningServer(ctx, "open console", id); err != nil {
		return nil, err
	}
	c := &echoConsole{sim: s, server: id, out: region.NewConsoleBuffer(region.ConsoleBacklog)}
	s.consolesMu.Lock()
	older := s.consoles[id]
	if s.consoles == nil {
		s.consoles = map[string]*echoConsole{}
	}
	s.consoles[id] = c
	s.consolesMu.Unlock()
	if older != nil {
		older.out.Close()
	}
	return c, nil
}

// echoConsole is a simulated serial console: it reads back what was written to it.
type echoConsole struct {
	sim    *Sim
	server string
	out    *region.ConsoleBuffer
}

func (c *echoConsole) Read(p []byte) (int, error) { return c.out.Read(p) }

func (c *echoConsole) Write(p []byte) (int, error) {
	if _, err := c.out.Write(bytes.ReplaceAll(p, []byte("\r"), []byte("\r\n"))); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (c *echoConsole) Close() error {
	c.sim.consolesMu.Lock()
	if c.sim.consoles[c.server] == c {
		delete(c.sim.consoles, c.server)
	}
	c.sim.consolesMu.Unlock()
	return c.out.Close()
}

// SSHKey implements region.Client: one ed25519 key pair per project, made on first use.
func (s *Sim) SSHKey(ctx context.Context, id string) (region.SSHKey, error) {
	if err := s.call(ctx, "ssh key"); err != nil {
		return region.SSHKey{}, err
	}
	srv, err := s.read(ctx, s.rdb, id)
	if err != nil {
		return region.SSHKey{}, fmt.Errorf("ssh key: %w", err)
	}
	if srv.SSHCertificateAuthorityID != "" {
		return region.SSHKey{}, fmt.Errorf("ssh key: the server accepts certificates of SSH certificate authority %s, not the project key pair: %w", srv.SSHCertificateAuthorityID, region.ErrRefused)
	}
	key := sshKeyKey(srv.OrganizationID, srv.ProjectID)
	_, private, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return region.SSHKey{}, fmt.Errorf("ssh key: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(private)
	if err != nil {
		return region.SSHKey{}, fmt.Errorf("ssh key: %w", err)
	}
	// SETNX keeps the first key of the project when two requests race.
	s.rdb.SetNX(ctx, key, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0)
	stored, err := s.rdb.Get(ctx, key).Result()
	if err != nil {
		return region.SSHKey{}, fmt.Errorf("ssh key: %w", err)
	}
	return region.SSHKey{PrivateKey: stored}, nil
}

// Snapshot implements region.Client: the image copies the shape of the server's image (a
// catalogue image, or a snapshot it was created from), is as large as the server's disk, and
// belongs to the server's project.
func (s *Sim) Snapshot(ctx context.Context, id string, req region.ImageRequest) (region.Image, error) {
	if err := s.call(ctx, "snapshot"); err != nil {
		return region.Image{}, err
	}
	srv, err := s.read(ctx, s.rdb, id)
	if err != nil {
		return region.Image{}, fmt.Errorf("snapshot: %w", err)
	}
	if srv.State != region.ServerRunning && srv.State != region.ServerStopped {
		return region.Image{}, fmt.Errorf("snapshot: the server is %s: %w", srv.State, region.ErrRefused)
	}
	base, err := s.sourceImage(ctx, srv)
	if err != nil {
		return region.Image{}, fmt.Errorf("snapshot: %w", err)
	}
	img := region.Image{
		ID: uuid.NewString(), Name: req.Name, Architecture: base.Architecture, SizeGiB: base.SizeGiB,
		Virtualization: base.Virtualization, State: region.ImageStateCreating, OS: base.OS,
		Regions: []string{srv.RegionID}, OrganizationID: srv.OrganizationID, ProjectID: srv.ProjectID, Tags: req.Tags,
	}
	if f, ok := s.opts.Catalog.Flavor(srv.FlavorID); ok {
		img.SizeGiB = region.DiskGiB(f.DiskGB)
	}
	data, _ := json.Marshal(img) // an Image always encodes
	due := s.opts.Now().Add(s.opts.PowerDelay)
	_, err = s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, imageKey(img.ID), data, 0)
		p.SAdd(ctx, projectImagesKey(img.OrganizationID, img.ProjectID), img.ID)
		p.ZAdd(ctx, dueKey, redis.Z{Score: float64(due.UnixMilli()), Member: imageDuePrefix + img.ID})
		return nil
	})
	if err != nil {
		return region.Image{}, fmt.Errorf("snapshot: %w", err)
	}
	return img, nil
}

// sourceImage is the image the server was created from: a catalogue image, or a snapshot of
// its project.
func (s *Sim) sourceImage(ctx context.Context, srv region.Server) (*region.Image, error) {
	if base, ok := s.opts.Catalog.Image(srv.ImageID); ok {
		return base, nil
	}
	img, err := s.image(ctx, s.rdb, srv.ImageID)
	if errors.Is(err, region.ErrImageNotFound) || err == nil && (img.OrganizationID != srv.OrganizationID || img.ProjectID != srv.ProjectID) {
		return nil, fmt.Errorf("the server's image %s is gone: %w", srv.ImageID, region.ErrRefused)
	}
	return img, err
}

// image reads an image the region made.
func (s *Sim) image(ctx context.Context, c redis.Cmdable, id string) (*region.Image, error) {
	data, err := c.Get(ctx, imageKey(id)).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("image %q: %w", id, region.ErrImageNotFound)
	}
	if err != nil {
		return nil, err
	}
	var img region.Image
	if err := json.Unmarshal(data, &img); err != nil {
		return nil, fmt.Errorf("decode image %s: %w", id, err)
	}
	return &img, nil
}

// DeleteImage implements region.Client.
func (s *Sim) DeleteImage(ctx context.Context, org, project, id string) error {
	if err := s.call(ctx, "delete image"); err != nil {
		return err
	}
	err := s.retry(ctx, func(tx *redis.Tx) error {
		img, err := s.image(ctx, tx, id)
		if err != nil {
			return err
		}
		if img.OrganizationID != org || img.ProjectID != project {
			return fmt.Errorf("image %q: %w", id, region.ErrImageNotFound)
		}
		if img.State == region.ImageStateCreating {
			return fmt.Errorf("image %s is being made: %w", id, region.ErrRefused)
		}
		_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Del(ctx, imageKey(id))
			p.SRem(ctx, projectImagesKey(org, project), id)
			p.ZRem(ctx, dueKey, imageDuePrefix+id)
			return nil
		})
		return err
	}, imageKey(id))
	if err != nil {
		return fmt.Errorf("delete image: %w", err)
	}
	return nil
}

// imageReady is the clock's step that finishes a snapshot.
func (s *Sim) imageReady(ctx context.Context, id string) error {
	return s.retry(ctx, func(tx *redis.Tx) error {
		data, err := tx.Get(ctx, imageKey(id)).Bytes()
		if errors.Is(err, redis.Nil) {
			_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error { p.ZRem(ctx, dueKey, imageDuePrefix+id); return nil })
			return err
		}
		if err != nil {
			return err
		}
		var img region.Image
		if err := json.Unmarshal(data, &img); err != nil {
			return fmt.Errorf("decode image %s: %w", id, err)
		}
		img.State = region.ImageStateReady
		data, _ = json.Marshal(img)
		_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Set(ctx, imageKey(id), data, 0)
			p.ZRem(ctx, dueKey, imageDuePrefix+id)
			return nil
		})
		return err
	}, imageKey(id))
}

// Images implements region.Client.
func (s *Sim) Images(ctx context.Context, org, project string) ([]region.Image, error) {
	if err := s.call(ctx, "images"); err != nil {
		return nil, err
	}
	ids, err := s.rdb.SMembers(ctx, projectImagesKey(org, project)).Result()
	if err != nil {
		return nil, fmt.Errorf("images: %w", err)
	}
	out := []region.Image{}
	if len(ids) == 0 {
		return out, nil
	}
	keys := make([]string, len(ids))
	for i, id := range ids {
		keys[i] = imageKey(id)
	}
	// One round trip for all of them; the keys share the {sim} hash tag.
	values, err := s.rdb.MGet(ctx, keys...).Result()
	if err != nil {
		return nil, fmt.Errorf("images: %w", err)
	}
	for i, v := range values {
		data, ok := v.(string)
		if !ok {
			continue // deleted since the listing
		}
		var img region.Image
		if err := json.Unmarshal([]byte(data), &img); err != nil {
			return nil, fmt.Errorf("decode image %s: %w", ids[i], err)
		}
		out = append(out, img)
	}
	return out, nil
}

// ResizeServer implements region.Client: a stopped server takes the flavor at once; its
// disk may only grow.
func (s *Sim) ResizeServer(ctx context.Context, id, flavorID string) (region.Server, error) {
	if err := s.call(ctx, "resize server"); err != nil {
		return region.Server{}, err
	}
	to, ok := s.opts.Catalog.Flavor(flavorID)
	if !ok {
		return region.Server{}, fmt.Errorf("resize server: flavor %q does not exist: %w", flavorID, region.ErrRefused)
	}
	srv, err := s.update(ctx, id, func(srv *region.Server) (time.Time, error) {
		if srv.State != region.ServerStopped {
			return time.Time{}, fmt.Errorf("cannot resize a server that is %s: it must be STOPPED: %w", srv.State, region.ErrRefused)
		}
		if from, ok := s.opts.Catalog.Flavor(srv.FlavorID); ok && to.DiskGB < from.DiskGB {
			return time.Time{}, fmt.Errorf("the disk of flavor %s (%d GB) is smaller than the server's (%d GB), and a disk never shrinks: %w",
				to.ID, to.DiskGB, from.DiskGB, region.ErrRefused)
		}
		srv.FlavorID = to.ID
		return time.Time{}, nil // stopped: nothing scheduled
	})
	if err != nil {
		return region.Server{}, fmt.Errorf("resize server: %w", err)
	}
	return srv, nil
}

// ConsoleOutput implements region.Client with the boot log a Linux guest of the server's
// shape would have written so far, made up from what the region knows of it.
func (s *Sim) ConsoleOutput(ctx context.Context, id string, tailBytes int) (region.ConsoleOutput, error) {
	if err := s.call(ctx, "console output"); err != nil {
		return region.ConsoleOutput{}, err
	}
	srv, err := s.read(ctx, s.rdb, id)
	if err != nil {
		return region.ConsoleOutput{}, fmt.Errorf("console output: %w", err)
	}
	return region.TailText(bootLog(srv, s.opts.Catalog), min(tailBytes, region.ConsoleOutputMax), s.opts.Now()), nil
}

// bootLog is a plausible serial console of the server (lines end as a serial port's do,
// with a carriage return): the kernel's first lines while it
// builds, cloud-init's once it runs (with its addresses and SSH host key fingerprint), and a
// power-off when it stopped.
func bootLog(srv region.Server, cat *region.Catalog) []byte {
	var b []byte
	line := func(at float64, format string, args ...any) {
		b = fmt.Appendf(b, "[%12.6f] ", at)
		b = fmt.Appendf(b, format, args...)
		b = append(b, '\r', '\n')
	}
	cpus, mem := int64(1), int64(1)
	if f, ok := cat.Flavor(srv.FlavorID); ok {
		cpus, mem = f.CPUs, f.MemoryGiB
	}
	if srv.State == region.ServerPending {
		return b
	}
	line(0, "Linux version 6.1.0-28-amd64 (debian-kernel@lists.debian.org) #1 SMP PREEMPT_DYNAMIC Debian 6.1.119-1")
	line(0, "Command line: BOOT_IMAGE=/vmlinuz root=LABEL=root ro console=ttyS0")
	line(0.000012, "Memory: %dK available", mem<<20)
	line(0.041250, "smp: Brought up 1 node, %d CPUs", cpus)
	line(0.912004, "virtio_net virtio1 ens3: renamed from eth0")
	if srv.State == region.ServerBuilding || srv.State == region.ServerError {
		return b
	}
	sum := sha256.Sum256([]byte(srv.ID))
	line(3.120771, "cloud-init[412]: Cloud-init v. 22.4.2 running 'init' at %s. Up 3.10 seconds.", srv.CreatedAt.UTC().Format(time.RFC1123Z))
	line(3.201994, "cloud-init[412]: ci-info: | ens3 | True | %s | 255.255.255.0 | global | %s |", srv.PrivateIP, srv.MAC)
	line(4.587310, "cloud-init[598]: Generating public/private ed25519 key pair.")
	line(4.601442, "cloud-init[598]: The key fingerprint is: SHA256:%s root@%s",
		strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "="), srv.Name)
	line(6.004518, "cloud-init[715]: Cloud-init v. 22.4.2 finished. Datasource DataSourceNoCloud. Up 6.00 seconds")
	b = fmt.Appendf(b, "\r\nDebian GNU/Linux 12 %s ttyS0\r\n\r\n%s login: ", srv.Name, srv.Name)
	if srv.State == region.ServerStopping || srv.State == region.ServerStopped {
		b = append(b, '\r', '\n')
		line(812.440122, "reboot: Power down")
	}
	return b
}
