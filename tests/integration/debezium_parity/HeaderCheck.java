// Reads key-change headers back the way a Kafka Connect sink with Connect's defaults does.
//
// Input: one case per line, "<our header, base64>\t<the key as a JsonConverter record with its
// schema, base64>". For each case, prints
// "<ours>\t<connect's>\t<connect's header, base64>\t<schema of ours>", where <ours> and
// <connect's> are "OK" or "FAILED: <error>": whether SimpleHeaderConverter (the worker's default
// header.converter) reads our header, and the header Connect itself writes for that key
// (SimpleHeaderConverter.fromConnectHeader, what Debezium in Kafka Connect writes), back into
// a value that Debezium's JDBC sink can hold. The JDBC sink (KafkaDebeziumSinkRecord's
// getRecordHeaders, 3.6) builds a struct of every header of every record, a field per header
// with the header's schema, and puts the header's value in it; that is what is done here.
//
// Compiled and run by tests/integration/debezium_parity/test_connect_headers.py against the
// connect-json jars of the Kafka version the stack runs.

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Base64;
import java.util.Map;

import org.apache.kafka.connect.data.Schema;
import org.apache.kafka.connect.data.SchemaAndValue;
import org.apache.kafka.connect.data.SchemaBuilder;
import org.apache.kafka.connect.data.Struct;
import org.apache.kafka.connect.json.JsonConverter;
import org.apache.kafka.connect.storage.SimpleHeaderConverter;

public final class HeaderCheck {
    private static final String NAME = "__debezium.newkey";

    private HeaderCheck() {
    }

    public static void main(String[] args) throws Exception {
        JsonConverter keys = new JsonConverter();
        keys.configure(Map.of("schemas.enable", "true", "decimal.format", "BASE64"), true);
        SimpleHeaderConverter headers = new SimpleHeaderConverter();
        headers.configure(Map.of());
        Base64.Decoder b64 = Base64.getDecoder();
        for (String line : Files.readAllLines(Path.of(args[0]), StandardCharsets.UTF_8)) {
            if (line.isEmpty()) {
                continue;
            }
            String[] parts = line.split("\t", -1);
            byte[] ours = b64.decode(parts[0]);
            SchemaAndValue key = keys.toConnectData("t", b64.decode(parts[1]));
            byte[] connects = headers.fromConnectHeader("t", NAME, key.schema(), key.value());
            SchemaAndValue read = headers.toConnectHeader("t", NAME, ours);
            System.out.println(readBack(headers, ours) + "\t" + readBack(headers, connects) + "\t"
                    + Base64.getEncoder().encodeToString(connects) + "\t" + describe(read.schema()));
        }
    }

    private static String readBack(SimpleHeaderConverter headers, byte[] data) {
        try {
            SchemaAndValue read = headers.toConnectHeader("t", NAME, data);
            Schema schema = SchemaBuilder.struct().field(NAME, read.schema()).build();
            new Struct(schema).put(NAME, read.value());
            return "OK";
        }
        catch (RuntimeException e) {
            return "FAILED: " + e.getMessage();
        }
    }

    private static String describe(Schema schema) {
        if (schema == null) {
            return "null";
        }
        if (schema.type() == Schema.Type.MAP) {
            return "MAP<" + describe(schema.keySchema()) + "," + describe(schema.valueSchema()) + ">";
        }
        return schema.name() == null ? schema.type().toString() : schema.name();
    }
}
