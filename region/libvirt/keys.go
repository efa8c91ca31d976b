package libvirt

// The driver's Redis keys. Every key of a region carries the region's id as its hash tag, so
// that on a Redis Cluster a region's keys live on one shard.

// sshKeyKey holds a project's SSH key pair (OpenSSH PEM), shared by every process.
func sshKeyKey(regionID, org, project string) string {
	return "libvirt:{" + regionID + "}:sshkey:" + org + "/" + project
}

// poolKey is the prefix of a host's pool's keys: each host has a pool of its own. A region that
// names its one host by uri alone (host "") keeps the keys it had before regions had hosts.
func poolKey(regionID, host string) string {
	if host == "" {
		return "libvirt:{" + regionID + "}:"
	}
	return "libvirt:{" + regionID + "}:host:" + host + ":"
}

// importLockKey is held (with a random token, for importLease) by the process importing an
// image's base volume into a host's pool.
func importLockKey(regionID, host, volume string) string {
	return poolKey(regionID, host) + "import:" + volume
}

// imageReadyKey marks an imported base volume as whole: it exists once every byte is in the
// host's pool, and a base volume without it is never backed onto.
func imageReadyKey(regionID, host, volume string) string {
	return poolKey(regionID, host) + "imported:" + volume
}

// hostInstancesKey is a host's record of the instances that may have a server on it, in a
// region of several hosts (instances.go).
func hostInstancesKey(regionID, host string) string {
	return "libvirt:{" + regionID + "}:host-instances:" + host
}

// snapshotLockKey is held (with the image's id, for snapshotLease) by the process making a
// snapshot of the server: one snapshot of a server at a time, and a snapshot whose lease ran
// out was cut short.
func snapshotLockKey(regionID, serverID string) string {
	return "libvirt:{" + regionID + "}:snapshot:" + serverID
}

// imagesKey is the region's hash of the images its snapshots made: image id → its record.
func imagesKey(regionID string) string {
	return "libvirt:{" + regionID + "}:images"
}
