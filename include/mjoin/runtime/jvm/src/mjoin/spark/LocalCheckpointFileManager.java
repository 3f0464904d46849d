package mjoin.spark;

import java.io.File;
import java.io.FileOutputStream;
import java.io.IOException;
import java.nio.file.Files;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.Path;
import org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager;

/**
 * Spark's checkpoint file manager for a checkpoint on the local file system, without a process fork per
 * log write (see include/mjoin/runtime/jvm/__init__.py).
 *
 * <p>Spark's {@code FileSystemBasedCheckpointFileManager} writes every offset and commit log entry to a
 * temporary file through Hadoop's {@code LocalFileSystem}, then renames it into place. Without Hadoop's
 * native library (pip's PySpark has none), Hadoop sets the permission of every file it creates by running
 * {@code chmod} in a new process, for the file and again for its {@code .crc} checksum: four forks per
 * micro-batch, ~8 ms each here. This class changes only how the temporary file is created: with
 * {@code java.io} (the permission the umask gives, as the chmod set it: 0644), no checksum file. The
 * rename into place, reading, listing and deleting are Spark's (Hadoop's). A file without a checksum file
 * is read without verification, as Hadoop reads any such file. Other file systems: Spark's behaviour.
 */
public class LocalCheckpointFileManager extends FileSystemBasedCheckpointFileManager {

    public LocalCheckpointFileManager(Path path, Configuration hadoopConf) {
        super(path, hadoopConf);
    }

    @Override
    public FSDataOutputStream createTempFile(Path path) {
        if (!"file".equals(fs().getUri().getScheme())) {
            return super.createTempFile(path);
        }
        try {
            File file = new File(fs().makeQualified(path).toUri());
            File parent = file.getParentFile();
            if (parent != null) {
                Files.createDirectories(parent.toPath());
            }
            return new FSDataOutputStream(new FileOutputStream(file, false), null);
        } catch (IOException e) {
            throw new RuntimeException("cannot create " + path + ": " + e.getMessage(), e);
        }
    }
}
