package openstack

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"

	"github.com/google/uuid"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/keypairs"
	"github.com/redis/go-redis/v9"
	"golang.org/x/crypto/ssh"

	"github.com/computeql/computeql/region"
)

// sshKeyKey holds a project's SSH private key (OpenSSH PEM), shared by every process; the
// region's id is its hash tag, so a region's keys live on one shard of a Redis Cluster.
func sshKeyKey(regionID, org, project string) string {
	return "openstack:{" + regionID + "}:sshkey:" + org + "/" + project
}

// projectKey returns the project's private key, made by the first process that needs it.
func (d *Driver) projectKey(ctx context.Context, org, project string) (string, error) {
	key := sshKeyKey(d.opts.Region.ID, org, project)
	pemKey, err := d.opts.Redis.Get(ctx, key).Result()
	if err == nil {
		return pemKey, nil
	}
	if !errors.Is(err, redis.Nil) {
		return "", fmt.Errorf("openstack: read the SSH key of %s/%s: %w: %w", org, project, err, region.ErrUnavailable)
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return "", fmt.Errorf("openstack: generate an SSH key: %w", err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "computeql "+org+"/"+project)
	if err != nil {
		return "", fmt.Errorf("openstack: encode an SSH key: %w", err)
	}
	// Another process may have made one meanwhile: the first one kept is everyone's.
	if err := d.opts.Redis.SetNX(ctx, key, string(pem.EncodeToMemory(block)), 0).Err(); err != nil {
		return "", fmt.Errorf("openstack: keep the SSH key of %s/%s: %w: %w", org, project, err, region.ErrUnavailable)
	}
	pemKey, err = d.opts.Redis.Get(ctx, key).Result()
	if err != nil {
		return "", fmt.Errorf("openstack: read the SSH key of %s/%s: %w: %w", org, project, err, region.ErrUnavailable)
	}
	return pemKey, nil
}

// largeKey holds the user data and SSH keys of a server (largeFields as JSON), under the
// reference its metadata compute:large holds.
func largeKey(regionID, ref string) string {
	return "openstack:{" + regionID + "}:large:" + ref
}

// largeFields are what a server is made with that Nova cannot give back: user data (which its
// default policy shows to admins only) and SSH keys (longer than a metadata value may be);
// and a snapshot's tags, which a Glance property would pass on to every later snapshot of a
// server made from it.
type largeFields struct {
	UserData      []byte            `json:"userData,omitempty"`
	SSHPublicKeys []string          `json:"sshPublicKeys,omitempty"`
	Tags          map[string]string `json:"tags,omitempty"`
}

// keepLargeFields keeps large fields, before the server or image that has them is made, and
// returns their reference; "" when there are none.
func (d *Driver) keepLargeFields(ctx context.Context, l largeFields) (string, error) {
	if len(l.UserData) == 0 && len(l.SSHPublicKeys) == 0 && len(l.Tags) == 0 {
		return "", nil
	}
	b, err := json.Marshal(l)
	if err != nil {
		return "", fmt.Errorf("openstack: encode user data: %w", err)
	}
	ref := uuid.NewString()
	if err := d.opts.Redis.Set(ctx, largeKey(d.opts.Region.ID, ref), b, 0).Err(); err != nil {
		return "", fmt.Errorf("openstack: keep user data: %w: %w", err, region.ErrUnavailable)
	}
	return ref, nil
}

// largeFields reads back what keepLargeFields kept; nothing when ref is "".
func (d *Driver) largeFields(ctx context.Context, ref string) (largeFields, error) {
	all, err := d.largeFieldsOf(ctx, []string{ref})
	if err != nil {
		return largeFields{}, err
	}
	return all[0], nil
}

// largeFieldsOf reads back, in one round trip, what keepLargeFields kept under each reference;
// nothing for "" or for fields deleted with their server or image a moment ago.
func (d *Driver) largeFieldsOf(ctx context.Context, refs []string) ([]largeFields, error) {
	out := make([]largeFields, len(refs))
	var keys []string
	var at []int
	for i, ref := range refs {
		if ref != "" {
			keys = append(keys, largeKey(d.opts.Region.ID, ref))
			at = append(at, i)
		}
	}
	if len(keys) == 0 {
		return out, nil
	}
	vals, err := d.opts.Redis.MGet(ctx, keys...).Result()
	if err != nil {
		return nil, fmt.Errorf("openstack: read user data and tags: %w: %w", err, region.ErrUnavailable)
	}
	for j, v := range vals {
		if s, ok := v.(string); ok {
			if err := json.Unmarshal([]byte(s), &out[at[j]]); err != nil {
				return nil, fmt.Errorf("openstack: %s in Redis: %w", keys[j], err)
			}
		}
	}
	return out, nil
}

// dropLargeFields deletes what a create that failed kept.
func (d *Driver) dropLargeFields(ctx context.Context, ref string) {
	if ref == "" {
		return
	}
	if err := d.opts.Redis.Del(ctx, largeKey(d.opts.Region.ID, ref)).Err(); err != nil {
		d.log.Warn("openstack: left behind", "what", "user data", "ref", ref, "err", err)
	}
}

// keyPairName is the Nova key pair of a project of the region.
func keyPairName(regionID, org, project string) string {
	return "computeql-" + regionID + "-" + org + "-" + project
}

// ensureKeyPair makes sure Nova has the project's key pair, and returns its name.
func (d *Driver) ensureKeyPair(ctx context.Context, org, project string) (string, error) {
	name := keyPairName(d.opts.Region.ID, org, project)
	if _, ok := d.keyPairs.Load(name); ok {
		return name, nil
	}
	pemKey, err := d.projectKey(ctx, org, project)
	if err != nil {
		return "", err
	}
	signer, err := ssh.ParsePrivateKey([]byte(pemKey))
	if err != nil {
		return "", fmt.Errorf("openstack: the SSH key of %s/%s in Redis: %w", org, project, err)
	}
	public := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(signer.PublicKey())))
	var have *keypairs.KeyPair
	err = d.call(ctx, "read key pair "+name, func(ctx context.Context, c *clients) error {
		have, err = keypairs.Get(ctx, c.compute, name, nil).Extract()
		return err
	})
	switch {
	case err == nil && publicKeysEqual(have.PublicKey, public):
		d.keyPairs.Store(name, true)
		return name, nil
	case err == nil:
		// Its private key is not computeql's (Redis lost it): new servers get the one
		// computeql holds, servers made before keep the key they were given.
		d.log.Warn("openstack: replacing a key pair whose private key computeql does not hold", "keypair", name)
		err = d.call(ctx, "delete key pair "+name, func(ctx context.Context, c *clients) error {
			return keypairs.Delete(ctx, c.compute, name, nil).ExtractErr()
		})
		if err != nil && !errors.Is(err, errNotFound) {
			return "", err
		}
	case !errors.Is(err, errNotFound):
		return "", err
	}
	err = d.call(ctx, "create key pair "+name, func(ctx context.Context, c *clients) error {
		_, err := keypairs.Create(ctx, c.compute, keypairs.CreateOpts{Name: name, PublicKey: public}).Extract()
		return err
	})
	// A conflict is another process that made it first, from the same key.
	if err != nil && !errors.Is(err, region.ErrRefused) {
		return "", err
	}
	d.keyPairs.Store(name, true)
	return name, nil
}

// publicKeysEqual compares authorized_keys lines by their type and key, not their comments.
func publicKeysEqual(a, b string) bool {
	fa, fb := strings.Fields(a), strings.Fields(b)
	return len(fa) >= 2 && len(fb) >= 2 && fa[0] == fb[0] && fa[1] == fb[1]
}
