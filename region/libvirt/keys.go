package libvirt

// The driver's Redis keys. Every key of a region carries the region's id as its hash tag, so
// that on a Redis Cluster a region's keys live on one shard.

// sshKeyKey holds a project's SSH key pair (OpenSSH PEM), shared by every process.
func sshKeyKey(regionID, org, project string) string {
	return "libvirt:{" + regionID + "}:sshkey:" + org + "/" + project
}

// importLockKey is held (with a random token, for importLease) by the process importing an
// image's base volume into the region's pool.
func importLockKey(regionID, volume string) string {
	return "libvirt:{" + regionID + "}:import:" + volume
}

// imageReadyKey marks an imported base volume as whole: it exists once every byte is in the
// pool, and a base volume without it is never backed onto.
func imageReadyKey(regionID, volume string) string {
	return "libvirt:{" + regionID + "}:imported:" + volume
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
